package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// frame is a payload as Open replayed it.
type frame struct {
	Pos     Pos
	Payload []byte
}

// openLog opens the log in dir, keeping what it replays; the log is closed when the test ends
// (closing it again is harmless).
func openLog(t *testing.T, dir string) (*Log, Recovery, []frame) {
	t.Helper()
	var got []frame
	l, rec, err := Open(dir, Options{}, func(p Pos, payload []byte) error {
		got = append(got, frame{Pos: p, Payload: bytes.Clone(payload)})
		return nil
	})
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, rec, got
}

func closeLog(t *testing.T, l *Log) {
	t.Helper()
	if err := l.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

func appendAll(t *testing.T, l *Log, payloads ...[]byte) []Pos {
	t.Helper()
	var ps []Pos
	for _, p := range payloads {
		pos, err := l.Append(p)
		if err != nil {
			t.Fatalf("append %d bytes: %v", len(p), err)
		}
		ps = append(ps, pos)
	}
	return ps
}

func rotate(t *testing.T, l *Log) uint64 {
	t.Helper()
	id, err := l.Rotate()
	if err != nil {
		t.Fatalf("rotate: %v", err)
	}
	return id
}

// payloads returns n payloads of size bytes each, every one different, none of them zeros.
func payloads(n, size int) [][]byte {
	r := rand.New(rand.NewPCG(uint64(n), uint64(size)))
	ps := make([][]byte, n)
	for i := range ps {
		ps[i] = make([]byte, size)
		for j := range ps[i] {
			ps[i][j] = byte(r.IntN(255) + 1)
		}
	}
	return ps
}

func payloadsOf(frames []frame) [][]byte {
	ps := make([][]byte, len(frames))
	for i, f := range frames {
		ps[i] = f.Payload
	}
	return ps
}

func positionsOf(frames []frame) []Pos {
	ps := make([]Pos, len(frames))
	for i, f := range frames {
		ps[i] = f.Pos
	}
	return ps
}

// concat joins slices of payloads, copying none of them.
func concat(pss ...[][]byte) [][]byte { return slices.Concat(pss...) }

// logFiles lists the names of dir's segments and snapshots (and anything else but LOCK).
func logFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if e.Name() != "LOCK" {
			names = append(names, e.Name())
		}
	}
	return names
}

func segName(id uint64) string  { return fileKey{id: id}.name() }
func snapName(id uint64) string { return fileKey{id: id, snap: true}.name() }

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// frameSize is the bytes a payload of n bytes takes in a file.
func frameSize(n int) int64 { return headerSize + int64(n) }

func TestAppendedPayloadsAreReplayedInOrderByTheNextOpenAndReadableAtTheirPositions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	l, rec, got := openLog(t, dir)
	if rec != (Recovery{}) || len(got) != 0 {
		t.Fatalf("a new log: recovery %+v, %d payloads replayed; want none", rec, len(got))
	}
	want := [][]byte{[]byte("a"), payloads(1, 100)[0], payloads(1, 70_000)[0]}
	pos := appendAll(t, l, want...)
	rotate(t, l)
	more := payloads(2, 3000)
	pos = append(pos, appendAll(t, l, more...)...)
	want = concat(want, more)

	for i, p := range pos {
		buf := make([]byte, len(want[i]))
		if err := l.ReadAt(p, buf); err != nil {
			t.Fatalf("read payload %d at %+v: %v", i, p, err)
		}
		if !bytes.Equal(buf, want[i]) {
			t.Errorf("payload %d read at %+v differs from what was appended", i, p)
		}
	}
	var total int64
	for _, p := range want {
		total += frameSize(len(p))
	}
	if snap, segs := l.Sizes(); snap != 0 || segs != total {
		t.Errorf("sizes: snapshot %d, segments %d; want 0, %d", snap, segs, total)
	}
	closeLog(t, l)

	l, rec, got = openLog(t, dir)
	if rec != (Recovery{}) {
		t.Errorf("recovery of a clean log: %+v; want none", rec)
	}
	if diff := cmp.Diff(want, payloadsOf(got)); diff != "" {
		t.Errorf("replayed payloads (-appended +replayed):\n%s", diff)
	}
	if diff := cmp.Diff(pos, positionsOf(got)); diff != "" {
		t.Errorf("replayed positions (-appended +replayed):\n%s", diff)
	}
	if snap, segs := l.Sizes(); snap != 0 || segs != total {
		t.Errorf("sizes after open: snapshot %d, segments %d; want 0, %d", snap, segs, total)
	}
	buf := make([]byte, len(want[2]))
	if err := l.ReadAt(got[2].Pos, buf); err != nil || !bytes.Equal(buf, want[2]) {
		t.Errorf("read at a replayed position after open: %v, or the bytes differ", err)
	}
}

func TestAnEmptyPayloadIsRefusedAndLeavesTheLogAsItWas(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	l, _, _ := openLog(t, dir)
	appendAll(t, l, []byte("a"))
	if _, err := l.Append(nil); err == nil {
		t.Fatal("appending an empty payload succeeded; want an error")
	}
	closeLog(t, l)
	_, rec, got := openLog(t, dir)
	if diff := cmp.Diff([][]byte{[]byte("a")}, payloadsOf(got)); diff != "" || rec != (Recovery{}) {
		t.Errorf("after a refused append: recovery %+v, payloads (-want +got):\n%s", rec, diff)
	}
}

func TestATornTailIsTruncatedAndTheFramesBeforeItAreKept(t *testing.T) {
	const size = 100
	fs := frameSize(size)
	tests := []struct {
		name     string
		segments int // the frames are spread over this many segments; the tail is the last's
		// tear damages the last segment, of frames frames, and returns how many of them it
		// leaves whole.
		tear     func(t *testing.T, path string, frames int) int
		wantTorn int64
	}{{
		name:     "a file cut short in the last frame's header",
		segments: 1,
		tear: func(t *testing.T, path string, frames int) int {
			if err := os.Truncate(path, int64(frames-1)*fs+5); err != nil {
				t.Fatal(err)
			}
			return frames - 1
		},
		wantTorn: 5,
	}, {
		name:     "a file cut short in the last frame's payload",
		segments: 1,
		tear: func(t *testing.T, path string, frames int) int {
			if err := os.Truncate(path, int64(frames)*fs-10); err != nil {
				t.Fatal(err)
			}
			return frames - 1
		},
		wantTorn: fs - 10,
	}, {
		name:     "a tail of zeros after the last frame",
		segments: 1,
		tear: func(t *testing.T, path string, frames int) int {
			writeFile(t, path, append(readFile(t, path), make([]byte, 4096)...))
			return frames
		},
		wantTorn: 4096,
	}, {
		name:     "the last frame's payload corrupted where it ends the file",
		segments: 1,
		tear: func(t *testing.T, path string, frames int) int {
			b := readFile(t, path)
			b[len(b)-1] ^= 0xff
			writeFile(t, path, b)
			return frames - 1
		},
		wantTorn: fs,
	}, {
		name:     "the last of several segments cut short in its last frame's payload",
		segments: 3,
		tear: func(t *testing.T, path string, frames int) int {
			if err := os.Truncate(path, int64(frames)*fs-1); err != nil {
				t.Fatal(err)
			}
			return frames - 1
		},
		wantTorn: fs - 1,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "log")
			l, _, _ := openLog(t, dir)
			const perSegment = 3
			want := payloads(perSegment*tt.segments, size)
			for s := range tt.segments {
				if s > 0 {
					rotate(t, l)
				}
				appendAll(t, l, want[s*perSegment:(s+1)*perSegment]...)
			}
			closeLog(t, l)
			last := filepath.Join(dir, segName(uint64(tt.segments)))
			kept := tt.tear(t, last, perSegment)
			want = want[:(tt.segments-1)*perSegment+kept]

			l, rec, got := openLog(t, dir)
			if rec.TornTail != tt.wantTorn || rec.Damaged != "" || rec.DamageErr != nil {
				t.Errorf("recovery %+v; want a torn tail of %d bytes and no damage", rec, tt.wantTorn)
			}
			if diff := cmp.Diff(want, payloadsOf(got)); diff != "" {
				t.Errorf("replayed payloads (-the frames before the tear +replayed):\n%s", diff)
			}
			if n := fileSize(t, last); n != int64(kept)*fs {
				t.Errorf("the torn segment holds %d bytes; want %d, its frames that check", n, int64(kept)*fs)
			}
			after := []byte("after the tear")
			appendAll(t, l, after)
			closeLog(t, l)

			_, rec, got = openLog(t, dir)
			if rec != (Recovery{}) {
				t.Errorf("recovery after the torn tail was truncated: %+v; want none", rec)
			}
			if diff := cmp.Diff(concat(want, [][]byte{after}), payloadsOf(got)); diff != "" {
				t.Errorf("replayed payloads after an append (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDamageIsSetAsideWithEverythingAfterItAndWhatCameBeforeIsReplayed(t *testing.T) {
	// Three segments of two frames each: seg 1 holds payloads 0 and 1, seg 2 holds 2 and 3,
	// seg 3 holds 4 and 5.
	const size = 100
	fs := frameSize(size)
	flip := func(off int64) func(t *testing.T, path string) {
		return func(t *testing.T, path string) {
			b := readFile(t, path)
			b[off] ^= 0x01
			writeFile(t, path, b)
		}
	}
	randomize := func(t *testing.T, path string) {
		b := readFile(t, path)
		r := rand.New(rand.NewPCG(7, 7))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		writeFile(t, path, b)
	}
	tests := []struct {
		name          string
		slash         bool // the log is opened by a path ending in a separator
		segment       int  // the segment damaged
		damage        func(t *testing.T, path string)
		wantKept      int   // how many payloads are replayed
		wantTruncated int64 // the damaged segment's size once its damage is set aside
		wantAside     []string
	}{{
		name:          "a byte flipped in a frame's payload followed by another frame",
		segment:       2,
		damage:        flip(headerSize + 50),
		wantKept:      2,
		wantTruncated: 0,
		wantAside:     []string{segName(2), segName(3)},
	}, {
		name:          "a byte flipped in the last segment's first frame's length, followed by its second",
		segment:       3,
		damage:        flip(1),
		wantKept:      4,
		wantTruncated: 0,
		wantAside:     []string{segName(3)},
	}, {
		name:          "a byte flipped in the last segment's first frame, followed by its second",
		segment:       3,
		damage:        flip(headerSize + 8),
		wantKept:      4,
		wantTruncated: 0,
		wantAside:     []string{segName(3)},
	}, {
		name:          "a byte flipped in the first segment's last frame, followed by later segments",
		segment:       1,
		damage:        flip(fs + headerSize),
		wantKept:      1,
		wantTruncated: fs,
		wantAside:     []string{segName(1), segName(2), segName(3)},
	}, {
		name:          "random bytes over a whole segment",
		segment:       2,
		damage:        randomize,
		wantKept:      2,
		wantTruncated: 0,
		wantAside:     []string{segName(2), segName(3)},
	}, {
		name:          "random bytes over the whole last segment",
		segment:       3,
		damage:        randomize,
		wantKept:      4,
		wantTruncated: 0,
		wantAside:     []string{segName(3)},
	}, {
		name:          "a byte flipped in a frame's payload when the log's path ends in a separator",
		slash:         true,
		segment:       2,
		damage:        flip(headerSize),
		wantKept:      2,
		wantTruncated: 0,
		wantAside:     []string{segName(2), segName(3)},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "log")
			l, _, _ := openLog(t, dir)
			want := payloads(6, size)
			for s := range 3 {
				if s > 0 {
					rotate(t, l)
				}
				appendAll(t, l, want[2*s:2*s+2]...)
			}
			closeLog(t, l)
			original := map[string][]byte{}
			for _, name := range logFiles(t, dir) {
				original[name] = readFile(t, filepath.Join(dir, name))
			}
			damaged := segName(uint64(tt.segment))
			tt.damage(t, filepath.Join(dir, damaged))
			original[damaged] = readFile(t, filepath.Join(dir, damaged))

			openAs := dir
			if tt.slash {
				openAs += string(os.PathSeparator)
			}
			l, rec, got := openLog(t, openAs)
			if rec.Damaged == "" || rec.DamageErr == nil || rec.TornTail != 0 {
				t.Fatalf("recovery %+v; want damage set aside and no torn tail", rec)
			}
			if filepath.Dir(rec.Damaged) != parent || !strings.HasPrefix(filepath.Base(rec.Damaged), "log.damaged-") {
				t.Errorf("damage set aside in %s; want a directory log.damaged-<time> in %s", rec.Damaged, parent)
			}
			if diff := cmp.Diff(tt.wantAside, logFiles(t, rec.Damaged)); diff != "" {
				t.Errorf("files set aside (-want +got):\n%s", diff)
			}
			for _, name := range tt.wantAside {
				if !bytes.Equal(readFile(t, filepath.Join(rec.Damaged, name)), original[name]) {
					t.Errorf("%s set aside differs from the file as it was before Open", name)
				}
			}
			if diff := cmp.Diff(want[:tt.wantKept], payloadsOf(got)); diff != "" {
				t.Errorf("replayed payloads (-the frames before the damage +replayed):\n%s", diff)
			}
			wantFiles := []string{}
			for s := 1; s <= tt.segment; s++ {
				wantFiles = append(wantFiles, segName(uint64(s)))
			}
			if diff := cmp.Diff(wantFiles, logFiles(t, dir)); diff != "" {
				t.Errorf("files left in the log (-want +got):\n%s", diff)
			}
			if n := fileSize(t, filepath.Join(dir, damaged)); n != tt.wantTruncated {
				t.Errorf("the damaged segment holds %d bytes; want %d, its frames before the damage", n, tt.wantTruncated)
			}

			after := []byte("after the damage")
			appendAll(t, l, after)
			closeLog(t, l)
			_, rec, got = openLog(t, dir)
			if rec != (Recovery{}) {
				t.Errorf("recovery once the damage was set aside: %+v; want none", rec)
			}
			if diff := cmp.Diff(concat(want[:tt.wantKept], [][]byte{after}), payloadsOf(got)); diff != "" {
				t.Errorf("replayed payloads after an append (-want +got):\n%s", diff)
			}
		})
	}
}

func TestADamagedSnapshotIsSetAsideWithEverySegmentAfterIt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	l, _, _ := openLog(t, dir)
	appendAll(t, l, payloads(2, 100)...)
	id := rotate(t, l)
	snap := payloads(3, 50)
	writeSnapshot(t, l, id, snap...)
	if err := l.Compact(id)(); err != nil {
		t.Fatal(err)
	}
	appendAll(t, l, []byte("after the snapshot"))
	closeLog(t, l)
	b := readFile(t, filepath.Join(dir, snapName(id)))
	b[frameSize(50)+headerSize] ^= 0x80 // the second frame's payload
	writeFile(t, filepath.Join(dir, snapName(id)), b)

	l, rec, got := openLog(t, dir)
	if rec.Damaged == "" || rec.DamageErr == nil {
		t.Fatalf("recovery %+v; want the snapshot's damage set aside", rec)
	}
	if diff := cmp.Diff([]string{segName(id), snapName(id)}, logFiles(t, rec.Damaged)); diff != "" {
		t.Errorf("files set aside (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(snap[:1], payloadsOf(got)); diff != "" {
		t.Errorf("replayed payloads (-the snapshot's frames before the damage +replayed):\n%s", diff)
	}
	appendAll(t, l, []byte("after the damage"))
	closeLog(t, l)
	_, rec, got = openLog(t, dir)
	if diff := cmp.Diff(concat(snap[:1], [][]byte{[]byte("after the damage")}), payloadsOf(got)); diff != "" || rec != (Recovery{}) {
		t.Errorf("after an append: recovery %+v; replayed (-want +got):\n%s", rec, diff)
	}
}

// writeSnapshot writes payloads as snapshot id and returns where they lie.
func writeSnapshot(t *testing.T, l *Log, id uint64, payloads ...[]byte) []Pos {
	t.Helper()
	var pos []Pos
	err := l.WriteSnapshot(id, func(add func([]byte) (Pos, error)) error {
		for _, p := range payloads {
			at, err := add(p)
			if err != nil {
				return err
			}
			pos = append(pos, at)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("write snapshot %d: %v", id, err)
	}
	return pos
}

func TestASnapshotReplacesTheSegmentsBeforeItsIDOnceCompacted(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	l, _, _ := openLog(t, dir)
	old := appendAll(t, l, payloads(2, 100)...)
	id := rotate(t, l)
	if id != 2 {
		t.Fatalf("the first rotation began segment %d; want 2", id)
	}
	newer := payloads(1, 30)
	newerPos := appendAll(t, l, newer...)
	snap := payloads(2, 40)
	snapPos := writeSnapshot(t, l, id, snap...)
	for i, p := range snapPos {
		buf := make([]byte, len(snap[i]))
		if err := l.ReadAt(p, buf); err != nil || !bytes.Equal(buf, snap[i]) {
			t.Errorf("read snapshot payload %d at %+v: %v, or the bytes differ", i, p, err)
		}
	}
	remove := l.Compact(id)
	if err := l.ReadAt(old[0], make([]byte, 100)); err == nil {
		t.Errorf("read at a position in a compacted segment succeeded; want an error")
	}
	// The files are the caller's to remove, where it likes: until then they stay.
	if diff := cmp.Diff([]string{segName(1), segName(2), snapName(2)}, logFiles(t, dir)); diff != "" {
		t.Errorf("files after compaction, before their removal (-want +got):\n%s", diff)
	}
	if err := remove(); err != nil {
		t.Fatalf("compact %d: remove the files: %v", id, err)
	}
	if diff := cmp.Diff([]string{segName(2), snapName(2)}, logFiles(t, dir)); diff != "" {
		t.Errorf("files after compaction (-want +got):\n%s", diff)
	}
	wantSnap, wantSegs := 2*frameSize(40), frameSize(30)
	if s, g := l.Sizes(); s != wantSnap || g != wantSegs {
		t.Errorf("sizes: snapshot %d, segments %d; want %d, %d", s, g, wantSnap, wantSegs)
	}
	last := []byte("after the compaction")
	lastPos := appendAll(t, l, last)
	closeLog(t, l)

	l, rec, got := openLog(t, dir)
	if rec != (Recovery{}) {
		t.Errorf("recovery: %+v; want none", rec)
	}
	if diff := cmp.Diff(concat(snap, newer, [][]byte{last}), payloadsOf(got)); diff != "" {
		t.Errorf("replayed payloads (-the snapshot's, then the newer segment's +replayed):\n%s", diff)
	}
	if diff := cmp.Diff(slices.Concat(snapPos, newerPos, lastPos), positionsOf(got)); diff != "" {
		t.Errorf("replayed positions (-as written +replayed):\n%s", diff)
	}
	if s, g := l.Sizes(); s != wantSnap || g != wantSegs+frameSize(len(last)) {
		t.Errorf("sizes after open: snapshot %d, segments %d; want %d, %d", s, g, wantSnap, wantSegs+frameSize(len(last)))
	}
}

func TestWhatAnInterruptedSnapshotOrCompactionLeftIsRemovedAtOpen(t *testing.T) {
	// Every case begins with snapshot 2 compacted (segment 1 is gone), then segment 2 holds
	// payload a, segment 3 payload b.
	a, b := []byte("a"), []byte("b")
	first := payloads(2, 20)
	second := payloads(2, 30)
	tests := []struct {
		name string
		// interrupt does what a crash stopped in the middle of; the log is closed after it.
		interrupt func(t *testing.T, l *Log, dir string)
		wantFiles []string
		want      [][]byte
	}{{
		name: "a snapshot's temporary file, written by a snapshot that never finished",
		interrupt: func(t *testing.T, l *Log, dir string) {
			writeFile(t, filepath.Join(dir, snapName(3)+".tmp"), second[0])
		},
		wantFiles: []string{segName(2), segName(3), snapName(2)},
		want:      concat(first, [][]byte{a, b}),
	}, {
		name: "the older snapshot and segments a finished snapshot replaced, never compacted",
		interrupt: func(t *testing.T, l *Log, dir string) {
			writeSnapshot(t, l, 3, second...)
		},
		wantFiles: []string{segName(3), snapName(3)},
		want:      concat(second, [][]byte{b}),
	}, {
		name: "the older snapshot and segments, and a later snapshot's temporary file",
		interrupt: func(t *testing.T, l *Log, dir string) {
			writeSnapshot(t, l, 3, second...)
			writeFile(t, filepath.Join(dir, snapName(4)+".tmp"), second[1])
		},
		wantFiles: []string{segName(3), snapName(3)},
		want:      concat(second, [][]byte{b}),
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "log")
			l, _, _ := openLog(t, dir)
			appendAll(t, l, []byte("gone"))
			writeSnapshot(t, l, rotate(t, l), first...)
			if err := l.Compact(2)(); err != nil {
				t.Fatal(err)
			}
			appendAll(t, l, a)
			rotate(t, l)
			appendAll(t, l, b)
			tt.interrupt(t, l, dir)
			closeLog(t, l)

			_, rec, got := openLog(t, dir)
			if rec != (Recovery{}) {
				t.Errorf("recovery: %+v; want none", rec)
			}
			if diff := cmp.Diff(tt.wantFiles, logFiles(t, dir)); diff != "" {
				t.Errorf("files after open (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.want, payloadsOf(got)); diff != "" {
				t.Errorf("replayed payloads (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAppendBeginsANewSegmentOnceTheLastReachesTheSegmentSize(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	l, _, _ := openLog(t, dir)
	if l.segLimit != SegmentSize {
		t.Fatalf("Open set the segment size to %d; want SegmentSize, %d", l.segLimit, SegmentSize)
	}
	const size = 100
	l.segLimit = 3 * frameSize(size)
	want := payloads(10, size)
	pos := appendAll(t, l, want...)
	var files []uint64
	for _, p := range pos {
		files = append(files, p.File)
	}
	if diff := cmp.Diff([]uint64{1, 1, 1, 2, 2, 2, 3, 3, 3, 4}, files); diff != "" {
		t.Errorf("segments appended to (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{segName(1), segName(2), segName(3), segName(4)}, logFiles(t, dir)); diff != "" {
		t.Errorf("segments (-want +got):\n%s", diff)
	}
	for id := range uint64(3) {
		if n := fileSize(t, filepath.Join(dir, segName(id+1))); n != 3*frameSize(size) {
			t.Errorf("segment %d holds %d bytes; want %d", id+1, n, 3*frameSize(size))
		}
	}
	if _, segs := l.Sizes(); segs != 10*frameSize(size) {
		t.Errorf("segments' size %d; want %d", segs, 10*frameSize(size))
	}
	closeLog(t, l)

	_, rec, got := openLog(t, dir)
	if rec != (Recovery{}) {
		t.Errorf("recovery: %+v; want none", rec)
	}
	if diff := cmp.Diff(want, payloadsOf(got)); diff != "" {
		t.Errorf("replayed payloads (-appended +replayed):\n%s", diff)
	}
	if diff := cmp.Diff(pos, positionsOf(got)); diff != "" {
		t.Errorf("replayed positions (-appended +replayed):\n%s", diff)
	}
}

// partialFrame is what a failed append can leave: a header that checks, for a payload of n
// bytes, and only part of that payload.
func partialFrame(n int) []byte {
	b := make([]byte, headerSize, headerSize+n/2)
	binary.LittleEndian.PutUint32(b[0:], uint32(n))
	binary.LittleEndian.PutUint32(b[4:], crc32.Checksum(b[0:4], castagnoli))
	return append(b, payloads(1, n/2)[0]...)
}

// When the segment could not be truncated after a failed append (the write and the truncate
// both failed), the partial frame must be cut off before anything else is written and before
// the segment is left behind.
func TestAPartialFrameThatCouldNotBeCutOffIsCutOffBeforeTheLogGoesOn(t *testing.T) {
	a, b, c := []byte("a"), []byte("b"), []byte("c")
	f1 := frameSize(1)
	tests := []struct {
		name      string
		then      func(t *testing.T, l *Log)
		wantSizes []int64 // the segments' sizes once then has returned
		want      [][]byte
	}{{
		name:      "the next append",
		then:      func(t *testing.T, l *Log) { appendAll(t, l, c) },
		wantSizes: []int64{3 * f1},
		want:      [][]byte{a, b, c},
	}, {
		name: "a rotation",
		then: func(t *testing.T, l *Log) {
			if id := rotate(t, l); id != 2 {
				t.Errorf("rotation began segment %d; want 2", id)
			}
			appendAll(t, l, c)
		},
		wantSizes: []int64{2 * f1, f1},
		want:      [][]byte{a, b, c},
	}, {
		name:      "closing the log",
		then:      func(t *testing.T, l *Log) { closeLog(t, l) },
		wantSizes: []int64{2 * f1},
		want:      [][]byte{a, b},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "log")
			l, _, _ := openLog(t, dir)
			appendAll(t, l, a, b)
			// What the failed append left, written through a file of its own: the log's
			// segment can be neither written nor truncated by it until the error clears.
			f, err := os.OpenFile(filepath.Join(dir, segName(1)), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.WriteAt(partialFrame(5000), l.curSize)
			if err = errors.Join(err, f.Close()); err != nil {
				t.Fatal(err)
			}
			l.broken = errors.New("write: input/output error")

			tt.then(t, l)
			var sizes []int64
			for _, name := range logFiles(t, dir) {
				sizes = append(sizes, fileSize(t, filepath.Join(dir, name)))
			}
			if diff := cmp.Diff(tt.wantSizes, sizes); diff != "" {
				t.Errorf("segments' sizes (-their whole frames +got):\n%s", diff)
			}
			closeLog(t, l)
			_, rec, got := openLog(t, dir)
			if rec != (Recovery{}) {
				t.Errorf("recovery: %+v; want none: the partial frame cut off", rec)
			}
			if diff := cmp.Diff(tt.want, payloadsOf(got)); diff != "" {
				t.Errorf("replayed payloads (-want +got):\n%s", diff)
			}
		})
	}
}
