package httpapi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// runQueue runs q's turns until the test ends.
func runQueue(t *testing.T, q *fairQueue) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = q.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// turn is one request's wait, in a goroutine of its own: its result arrives on the channel.
type turn struct {
	done func()
	err  error
}

func waitFor(q *fairQueue, group, flow string) chan turn {
	c := make(chan turn, 1)
	go func() {
		done, err := q.wait(context.Background(), group, flow)
		c <- turn{done, err}
	}()
	return c
}

// waiting is how many requests wait in q, for a test to wait on.
func (q *fairQueue) waitingNow() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiting
}

func eventuallyWaiting(t *testing.T, q *fairQueue, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); q.waitingNow() != n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiting; want %d", q.waitingNow(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func granted(t *testing.T, c chan turn, what string) func() {
	t.Helper()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("%s: %v; want a turn", what, r.err)
		}
		return r.done
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no turn within 10s", what)
	}
	return nil
}

func notYet(t *testing.T, c chan turn, what string) {
	t.Helper()
	select {
	case r := <-c:
		t.Fatalf("%s: answered (err %v) while it should wait", what, r.err)
	default:
	}
}

// grants records the order in which grant waiters got their turns.
type grants chan grant

type grant struct {
	who  string
	done func()
	err  error
}

func (g grants) wait(q *fairQueue, who, group, flow string) {
	go func() {
		done, err := q.wait(context.Background(), group, flow)
		g <- grant{who, done, err}
	}()
}

// order takes n turns one after the other (one seat: each is given back before the next is
// granted) and returns who had them.
func (g grants) order(t *testing.T, n int) []string {
	t.Helper()
	var who []string
	for range n {
		select {
		case l := <-g:
			if l.err != nil {
				t.Fatalf("%s: %v; want a turn", l.who, l.err)
			}
			who = append(who, l.who)
			l.done()
		case <-time.After(10 * time.Second):
			t.Fatalf("no turn within 10s after %v", who)
		}
	}
	return who
}

// A newcomer behind another's backlog waits for at most one of its turns: one flow's backlog,
// or one address's backlog spread over connections.
func TestANewcomerBehindABacklogWaitsForAtMostOneTurnOfIt(t *testing.T) {
	for _, tt := range []struct {
		name string
		flow func(i int) string // the backlog's i-th request's flow, all at 10.0.0.1
	}{
		{"one flow's backlog", func(int) string { return "mallory" }},
		{"six connections of one address", func(i int) string { return fmt.Sprintf("10.0.0.1:%d", i) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			q := newFairQueue(rate.NewLimiter(rate.Inf, 0), 1, 8, 32, time.Minute)
			runQueue(t, q)
			release := granted(t, waitFor(q, "10.0.0.1", tt.flow(0)), "the backlog's first")
			g := make(grants)
			for i := range 6 {
				g.wait(q, "backlog", "10.0.0.1", tt.flow(i+1))
			}
			eventuallyWaiting(t, q, 6)
			g.wait(q, "newcomer", "10.0.0.2", "newcomer")
			eventuallyWaiting(t, q, 7)
			release()
			if got := g.order(t, 7); slices.Index(got, "newcomer") > 1 {
				t.Errorf("turns %v: the newcomer waited for more than one turn of the backlog", got)
			}
		})
	}
}

func TestAFlowAtItsShareIsRefusedAtOnce(t *testing.T) {
	q := newFairQueue(rate.NewLimiter(rate.Inf, 0), 4, 2, 32, time.Minute)
	runQueue(t, q)
	first := granted(t, waitFor(q, "u", "mallory"), "the first")
	second := granted(t, waitFor(q, "u", "mallory"), "the second")
	if _, err := q.wait(context.Background(), "u", "mallory"); !errors.Is(err, errReviewsBusy) {
		t.Errorf("a third with a share of 2: %v; want errReviewsBusy", err)
	}
	granted(t, waitFor(q, "a", "alice"), "another flow")()
	first()
	second()
	granted(t, waitFor(q, "u", "mallory"), "once the share is given back")()
}

func TestAFullQueuePushesOutTheLongestFlowsNewestWaiter(t *testing.T) {
	q := newFairQueue(rate.NewLimiter(0, 0), 1, 8, 4, time.Minute) // nothing is ever granted
	runQueue(t, q)
	var flood []chan turn
	for range 4 {
		flood = append(flood, waitFor(q, "10.0.0.1", "mallory"))
		eventuallyWaiting(t, q, len(flood))
	}
	if _, err := q.wait(context.Background(), "10.0.0.1", "mallory"); !errors.Is(err, errReviewsBusy) {
		t.Fatalf("the longest flow once the queue is full: %v; want errReviewsBusy", err)
	}
	alice := waitFor(q, "10.0.0.2", "alice")
	select {
	case r := <-flood[3]:
		if !errors.Is(r.err, errReviewsBusy) {
			t.Fatalf("the newest of the longest flow: %v; want errReviewsBusy", r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no waiter was pushed out for a newcomer")
	}
	eventuallyWaiting(t, q, 4)
	notYet(t, alice, "the newcomer")
	for _, c := range flood[:3] {
		notYet(t, c, "the older waiters")
	}
}

func TestAWaiterWhoseTurnDoesNotComeIsRefused(t *testing.T) {
	q := newFairQueue(rate.NewLimiter(0, 0), 1, 8, 32, 50*time.Millisecond)
	runQueue(t, q)
	if _, err := q.wait(context.Background(), "u", "alice"); !errors.Is(err, errReviewsBusy) {
		t.Fatalf("%v; want errReviewsBusy after the wait", err)
	}
	if n := q.waitingNow(); n != 0 || len(q.groups) != 0 {
		t.Errorf("%d waiting and %d groups after the only waiter left; want none", n, len(q.groups))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := q.wait(ctx, "u", "alice"); !errors.Is(err, context.Canceled) {
		t.Errorf("a caller gone: %v; want its context's error", err)
	}
}

func TestTurnsComeNoFasterThanTheRate(t *testing.T) {
	q := newFairQueue(rate.NewLimiter(rate.Limit(1), 2), 8, 8, 32, time.Minute)
	runQueue(t, q)
	g := make(grants)
	for range 3 {
		g.wait(q, "alice", "u", "alice")
	}
	g.order(t, 2) // the burst
	// The third waits for the next token, a second away; time enough to see it has not come.
	select {
	case l := <-g:
		t.Fatalf("a third turn (err %v) within 100ms of a burst of 2 at 1 a second", l.err)
	case <-time.After(100 * time.Millisecond):
	}
	g.order(t, 1)
}
