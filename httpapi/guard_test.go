package httpapi

import (
	"context"
	"testing"
	"time"
)

// TestARefusalWaitsItsRetryAfterAndPastTheBoundIsAnsweredAtOnce: a refusal is answered once
// its wait has passed, or when its caller goes away; while maxWaitingRefusals wait, the next
// one is answered without waiting; once they have been answered, refusals wait again. (A wait
// of an hour stands for "not answered at once": the test would time out.)
func TestARefusalWaitsItsRetryAfterAndPastTheBoundIsAnsweredAtOnce(t *testing.T) {
	g := &gate{refusalWait: 50 * time.Millisecond}
	start := time.Now()
	g.waitToRefuse(context.Background())
	if waited := time.Since(start); waited < g.refusalWait {
		t.Fatalf("a refusal was answered after %s, want %s", waited, g.refusalWait)
	}

	g.refusalWait = time.Hour
	gone, leave := context.WithCancel(context.Background())
	leave()
	g.waitToRefuse(gone) // a caller gone: answered without waiting

	held, release := context.WithCancel(context.Background())
	done := make(chan struct{}, maxWaitingRefusals)
	for range maxWaitingRefusals {
		go func() { g.waitToRefuse(held); done <- struct{}{} }()
	}
	for g.refusing.Load() < maxWaitingRefusals {
		time.Sleep(time.Millisecond)
	}
	g.waitToRefuse(context.Background()) // one past the bound: answered without waiting
	release()
	for range maxWaitingRefusals {
		<-done
	}
	if n := g.refusing.Load(); n != 0 {
		t.Fatalf("%d refusals counted as waiting once all were answered", n)
	}
	g.refusalWait = 50 * time.Millisecond
	start = time.Now()
	g.waitToRefuse(context.Background())
	if waited := time.Since(start); waited < g.refusalWait {
		t.Fatalf("once the others were answered, a refusal was answered after %s, want %s", waited, g.refusalWait)
	}
}
