package leader

import (
	"testing"
	"time"
)

// TestTheFenceCutsWhatItBoundOnceItLapses: a context bound while the fence holds ends when the
// fence lapses, and not at a lapse a renewal moved further out.
func TestTheFenceCutsWhatItBoundOnceItLapses(t *testing.T) {
	f := newFence()
	if _, _, held := f.bound(t.Context()); held {
		t.Fatal("a fence never granted holds")
	}
	f.grant(time.Now().Add(50*time.Millisecond), term{holder: "a"})
	ctx, cancel, held := f.bound(t.Context())
	defer cancel()
	if !held {
		t.Fatal("a fence just granted does not hold")
	}
	renewedUntil := time.Now().Add(400 * time.Millisecond)
	f.grant(renewedUntil, term{holder: "a"}) // renewed before the first lapse
	select {
	case <-ctx.Done():
		if time.Now().Before(renewedUntil) {
			t.Fatal("the context was cut at the lapse the renewal moved")
		}
	case <-time.After(time.Minute):
		t.Fatal("the context outlived the fence by a minute")
	}
	if _, held := f.held(); held {
		t.Fatal("the fence holds after its context was cut")
	}
}
