package wal

import (
	"bytes"
	"fmt"
	"testing"
)

// TestWhatIsWrittenIsReadableAtOnceAndDurableOnceSyncedOrClosed: a frame written without a sync
// reads back at its position at once; Unsynced reports it until Sync; Rotate and Close sync
// what is pending, so the next Open replays every frame.
func TestWhatIsWrittenIsReadableAtOnceAndDurableOnceSyncedOrClosed(t *testing.T) {
	dir := t.TempDir()
	l, _, _ := openLog(t, dir)
	var want [][]byte
	write := func() Pos {
		t.Helper()
		p := fmt.Appendf(nil, "payload %d", len(want))
		pos, err := l.Write(p)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, p)
		got := make([]byte, len(p))
		if err := l.ReadAt(pos, got); err != nil || !bytes.Equal(got, p) {
			t.Fatalf("read back before a sync: %q, %v; want %q", got, err, p)
		}
		return pos
	}
	write()
	if !l.Unsynced() {
		t.Error("Unsynced is false after a write")
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if l.Unsynced() {
		t.Error("Unsynced is true after a sync")
	}
	write()
	rotate(t, l)
	if l.Unsynced() {
		t.Error("Unsynced is true after a rotation: the segment left behind must be durable")
	}
	write()
	closeLog(t, l)
	_, _, got := openLog(t, dir)
	if len(got) != len(want) {
		t.Fatalf("replayed %d frames; want %d", len(got), len(want))
	}
	for i, f := range got {
		if !bytes.Equal(f.Payload, want[i]) {
			t.Errorf("frame %d: %q; want %q", i, f.Payload, want[i])
		}
	}
}
