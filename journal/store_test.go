package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dynwatch/dynwatch/journal/wal"
	"github.com/dynwatch/dynwatch/object"
)

// TestAStoreOfALaterFormatIsRefused: a store written by a later release is not read as if it
// were this one's, nor set aside as damaged.
func TestAStoreOfALaterFormatIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	l, _, err := wal.Open(path, wal.Options{}, func(wal.Pos, []byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(append([]byte{recFormat}, appendString(nil, "99")...)); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := openStore(path, nil); err == nil || !strings.Contains(err.Error(), `format "99"`) {
		t.Fatalf("opening a store of format 99: %v; want an error naming the format", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("the store of a later format was moved: %v", err)
	}
}

// undecided is a sink whose filter cannot decide on any event.
type undecided struct{ target }

func (*undecided) Selects(object.Event) (bool, error) {
	return true, errors.New("operation cancelled: actual cost limit exceeded")
}

// TestAFilterErrorIsKeptInTheOutbox: an entry recorded with its sink's filter error reads back
// with it, after the store is closed and opened again, so a restart acts on it as the sink's
// filterErrors says rather than delivering it as selected.
func TestAFilterErrorIsKeptInTheOutbox(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	open := func(tg Target) *Journal {
		j, err := New(Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
			Path: path, Targets: func() []Target { return []Target{tg} }})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	j := open(&undecided{})
	j.OnEvent(addedAt("a", 11))
	flush(t, j)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j = open(&target{})
	t.Cleanup(func() { _ = j.Close() })
	var got []string
	if _, _, err := j.ReadOutbox("sink", 0, 0, func(e Entry) bool { got = append(got, e.FilterError); return true }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"operation cancelled: actual cost limit exceeded"}; !slices.Equal(got, want) {
		t.Errorf("the outbox read back after a restart has filter errors %q; want %q", got, want)
	}
}

// TestACorruptStoredObjectAffectsOnlyItself: a stored object whose JSON does not decode (its
// record checks: the bytes were written wrong, not damaged since) is counted, and its next
// version is handed on as ADDED, derived from the cache, since what the sinks saw of it is
// unknown; the other stored objects are compared as usual, and the commit that follows
// succeeds.
func TestACorruptStoredObjectAffectsOnlyItself(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	tg := &target{}
	targets := []Target{tg}
	j := openJournal(t, path, &targets)
	j.ListStarted(configmaps, 1, nil)
	j.OnEvent(addedAt("a", 10))
	j.OnEvent(addedAt("b", 11))
	j.ListSynced(configmaps, 1, 11)
	flush(t, j)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}

	l, _, err := wal.Open(path, wal.Options{}, func(wal.Pos, []byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	rec := []byte{recObject}
	for _, s := range []string{object.ResourceName(configmaps), "ns/a", "uid-a", "10"} {
		rec = appendString(rec, s)
	}
	rec = appendBytes(rec, []byte(`{"metadata":{"na`))
	if _, err := l.Append(rec); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	tg.entries = nil
	j = openJournal(t, path, &targets)
	j.ListStarted(configmaps, 1, nil)
	j.OnEvent(addedAt("a", 12)) // changed while dynwatch was stopped
	j.OnEvent(addedAt("b", 11)) // unchanged
	j.ListSynced(configmaps, 1, 12)
	flush(t, j)
	var got []string
	for _, e := range tg.entries {
		got = append(got, fmt.Sprintf("%s %s@%d old=%t", e.Event.Type, e.Event.Object.GetName(), e.Revision, e.Event.OldObject != nil))
	}
	if want := []string{"ADDED a@12 old=false"}; !slices.Equal(got, want) {
		t.Errorf("after the restart the sink was handed %q; want %q", got, want)
	}
	if n := counterValue(j.m.corrupt); n != 1 {
		t.Errorf("dynwatch_state_corrupt_entries_total = %v, want 1", n)
	}
	if n := counterValue(j.m.commitErrors); n != 0 {
		t.Errorf("dynwatch_state_commit_errors_total = %v: one corrupt object must not fail its commit", n)
	}
}

// TestAFileAtStatePathIsRefusedNamingIt: the store is a directory; a file where it should be is
// an error naming state.path, and the file is left as it is.
func TestAFileAtStatePathIsRefusedNamingIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	if err := os.WriteFile(path, []byte("not a log"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := openStore(path, nil); err == nil || !strings.Contains(err.Error(), "state.path "+path+": is a file") {
		t.Fatalf("opening a file as the store: %v; want an error naming state.path as a file", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "not a log" {
		t.Errorf("the file at state.path was changed: %q, %v", b, err)
	}
}

// TestAnEntryWhosePiecesDoNotDecodeIsCorrupt: an outbox entry whose body is in pieces that do
// not decode, or refer to bytes not before the entry in its file (its frame checks: the bytes
// were written wrong), is counted as corrupt and removed when its outbox is read; it neither
// stops the outbox's reading nor reads another file's bytes, and the entries after it are
// delivered.
func TestAnEntryWhosePiecesDoNotDecodeIsCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	l, _, err := wal.Open(path, wal.Options{}, func(wal.Pos, []byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	good := Entry{ID: "uid-b.11.added", Key: "configmaps/ns/b", Revision: 11}
	body := `{"type":"ADDED","resource":{"group":"","version":"v1","resource":"configmaps"},"object":{"metadata":{"name":"b","namespace":"ns","uid":"uid-b","resourceVersion":"11"}}}`
	bodies := map[string][]byte{
		"a reference before the file's start": binary.AppendUvarint(binary.AppendUvarint([]byte{pieced, pieceRef}, 1<<20), 10),
		"a reference longer than its reach":   binary.AppendUvarint(binary.AppendUvarint([]byte{pieced, pieceRef}, 4), 10),
		"a literal cut short":                 append(binary.AppendUvarint([]byte{pieced, pieceBytes}, 100), "{}"...),
		"a piece of no kind":                  {pieced, 9, 1, 2},
	}
	var payload []byte
	seq := uint64(0)
	for _, name := range slices.Sorted(maps.Keys(bodies)) {
		seq++
		d := good
		d.ID = name
		payload = append(payload, recEntry)
		payload = appendString(payload, "sink")
		payload = binary.AppendUvarint(payload, seq)
		payload = appendBytes(payload, append(appendEntry(nil, d), bodies[name]...))
	}
	good.Body = []byte(body)
	payload = append(payload, recEntry)
	payload = appendString(payload, "sink")
	payload = binary.AppendUvarint(payload, seq+1)
	payload = appendBytes(payload, appendEntry(nil, good))
	if _, err := l.Append(payload); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	targets := []Target{&target{}}
	j := openJournal(t, path, &targets)
	var got []string
	if _, end, err := j.ReadOutbox("sink", 0, 0, func(e Entry) bool { got = append(got, e.ID); return true }); err != nil || !end {
		t.Fatalf("reading the outbox: end %v, %v; want its end, and no error", end, err)
	}
	if !slices.Equal(got, []string{good.ID}) {
		t.Errorf("read %q; want only the entry that decodes", got)
	}
	if c := counterValue(j.m.corrupt); c != float64(len(bodies)) {
		t.Errorf("%v entries counted corrupt; want %d", c, len(bodies))
	}
}

// TestAStoreOfAnEarlierFormatIsReadAndWrittenOn: a store the last release wrote (format 8, its
// entries' bodies whole) opens, its outbox reads back, and the entries this release writes on
// it, whose bodies refer to their commit's objects, read back beside them, opened again too.
func TestAStoreOfAnEarlierFormatIsReadAndWrittenOn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	l, _, err := wal.Open(path, wal.Options{}, func(wal.Pos, []byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	earlier := addedWithData("a", 10, 2048)
	d := Entry{Event: earlier, ID: EventID(earlier), Key: object.OrderingKey(configmaps, "ns", "a"), Revision: 10}
	d.Body = AppendBody(nil, d)
	payload := append([]byte{recFormat}, appendString(nil, "8")...)
	payload = append(payload, recEntry)
	payload = appendString(payload, "sink")
	payload = binary.AppendUvarint(payload, 1)
	payload = appendBytes(payload, appendEntry(nil, d))
	if _, err := l.Append(payload); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	tg := &recorder{name: "sink"}
	targets := []Target{tg}
	j := openJournal(t, path, &targets)
	later := addedWithData("b", 11, 2048)
	j.OnEvent(later)
	flush(t, j)
	want := []string{string(d.Body), string(AppendBody(nil, tg.entries[0]))}
	for _, when := range []string{"at once", "opened again"} {
		var got []string
		if _, _, err := j.ReadOutbox("sink", 0, 0, func(e Entry) bool { got = append(got, string(AppendBody(nil, e))); return true }); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: the outbox read back %d bodies that differ from the %d written", when, len(got), len(want))
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		j = openJournal(t, path, &targets)
	}
}
