package wal

import (
	"bytes"
	"errors"
	"fmt"
	"os"
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

// TestWhatAFailedSyncWasToMakeDurableIsWrittenAgain: after a failed fdatasync the kernel may
// have dropped the dirty pages it could not write, so the frames that sync covered read back as
// whatever the volume held. The next write or sync writes them again first, and a later sync
// makes them durable; Unsynced reports them until it does.
func TestWhatAFailedSyncWasToMakeDurableIsWrittenAgain(t *testing.T) {
	for _, c := range []struct{ failed, next string }{{"Sync", "sync"}, {"Sync", "write"}, {"StartSync", "sync"}, {"StartSync", "write"}} {
		t.Run(c.failed+" failed then "+c.next, func(t *testing.T) {
			next := c.next
			dir := t.TempDir()
			l, _, _ := openLog(t, dir)
			durable, lost := []byte("durable before the failure"), []byte("written, then its sync failed")
			if _, err := l.Write(durable); err != nil {
				t.Fatal(err)
			}
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			pos, err := l.Write(lost)
			if err != nil {
				t.Fatal(err)
			}
			eio := errors.New("input/output error")
			l.datasync = func(*os.File) error { return eio }
			if err := syncBy(t, l, c.failed); !errors.Is(err, eio) {
				t.Fatalf("%s with fdatasync failing: %v; want %v", c.failed, err, eio)
			}
			if !l.Unsynced() {
				t.Error("Unsynced is false after a failed sync")
			}
			// What the dropped pages leave: the frame's bytes as the volume held them.
			start := pos.Off - headerSize
			if err := l.curF.Truncate(start); err != nil {
				t.Fatal(err)
			}
			if err := l.curF.Truncate(start + int64(headerSize+len(lost))); err != nil {
				t.Fatal(err)
			}
			l.datasync = datasync
			want := [][]byte{durable, lost}
			switch next {
			case "sync":
				if err := l.Sync(); err != nil {
					t.Fatal(err)
				}
			case "write":
				more := []byte("written after the failed sync")
				if _, err := l.Write(more); err != nil {
					t.Fatal(err)
				}
				want = append(want, more)
			}
			closeLog(t, l)
			_, rec, got := openLog(t, dir)
			if rec.TornTail != 0 || rec.Damaged != "" {
				t.Errorf("reopened with %+v; want a clean log", rec)
			}
			if len(got) != len(want) {
				t.Fatalf("replayed %d frames; want %d", len(got), len(want))
			}
			for i, f := range got {
				if !bytes.Equal(f.Payload, want[i]) {
					t.Errorf("frame %d: %q; want %q", i, f.Payload, want[i])
				}
			}
		})
	}
}

// syncBy syncs l by Sync, or by StartSync and then FinishSync once its fdatasync has returned.
func syncBy(t *testing.T, l *Log, how string) error {
	t.Helper()
	if how == "Sync" {
		return l.Sync()
	}
	done, err := l.StartSync()
	if err != nil {
		return err
	}
	if done == nil {
		t.Fatal("StartSync with something unsynced returned no channel")
	}
	<-done
	return l.FinishSync()
}

// TestWritesGoOnWhileASyncBegunByStartSyncRuns: StartSync runs the fdatasync on a goroutine of
// its own; what is written meanwhile is not counted durable by it, and a Sync meanwhile waits
// for it and syncs the rest.
func TestWritesGoOnWhileASyncBegunByStartSyncRuns(t *testing.T) {
	for _, finish := range []string{"FinishSync", "Sync"} {
		t.Run("finished by "+finish, func(t *testing.T) {
			dir := t.TempDir()
			l, _, _ := openLog(t, dir)
			entered, release := make(chan struct{}), make(chan struct{})
			l.datasync = func(f *os.File) error {
				close(entered)
				<-release
				return datasync(f)
			}
			write := func(p string) {
				t.Helper()
				if _, err := l.Write([]byte(p)); err != nil {
					t.Fatal(err)
				}
			}
			write("a")
			done, err := l.StartSync()
			if err != nil || done == nil {
				t.Fatalf("StartSync: %v, %v; want a channel", done, err)
			}
			<-entered
			write("b") // while a's fdatasync runs
			if again, _ := l.StartSync(); again != done {
				t.Error("StartSync with a sync in flight began another")
			}
			if d := l.Durable(); d != 0 {
				t.Errorf("%d frames durable while the only fdatasync runs; want 0", d)
			}
			close(release)
			l.datasync = datasync
			switch finish {
			case "FinishSync":
				<-done
				if err := l.FinishSync(); err != nil {
					t.Fatal(err)
				}
				if d := l.Durable(); d != 1 {
					t.Errorf("%d frames durable once a's fdatasync has returned; want 1, a", d)
				}
				if n := l.UnsyncedBytes(); n != headerSize+1 {
					t.Errorf("%d bytes unsynced; want b's frame, %d", n, headerSize+1)
				}
				if err := l.FinishSync(); err != nil {
					t.Errorf("FinishSync with no sync in flight: %v", err)
				}
			case "Sync":
				if err := l.Sync(); err != nil {
					t.Fatal(err)
				}
				if d, u := l.Durable(), l.Unsynced(); d != 2 || u {
					t.Errorf("after Sync: %d frames durable, unsynced %v; want 2, false", d, u)
				}
			}
			closeLog(t, l)
			_, _, got := openLog(t, dir)
			if len(got) != 2 {
				t.Fatalf("replayed %d frames; want 2", len(got))
			}
		})
	}
}

// TestAFrameOfManyPartsIsTheirConcatenation: a frame written from more parts than one system
// call takes (some empty, some large) reads back, at once and after a reopen, as the parts
// one after the other, with a checksum that checks.
func TestAFrameOfManyPartsIsTheirConcatenation(t *testing.T) {
	dir := t.TempDir()
	l, _, _ := openLog(t, dir)
	var parts [][]byte
	var want []byte
	for i := range 3*iovMax + 7 {
		var p []byte
		switch i % 5 {
		case 0: // empty
		case 1:
			p = bytes.Repeat([]byte{byte(i)}, 70_000)
		default:
			p = fmt.Appendf(nil, "part %d;", i)
		}
		parts = append(parts, p)
		want = append(want, p...)
	}
	pos, err := l.Write(parts...)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if err := l.ReadAt(pos, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back before a sync: %d bytes, %v; want the %d of the parts", len(got), err, len(want))
	}
	if _, err := l.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}
	closeLog(t, l)
	_, rec, frames := openLog(t, dir)
	if len(frames) != 2 || !bytes.Equal(frames[0].Payload, want) || string(frames[1].Payload) != "after" {
		t.Fatalf("reopened: %d frames (recovery %+v); want the parts' concatenation, then %q", len(frames), rec, "after")
	}
}
