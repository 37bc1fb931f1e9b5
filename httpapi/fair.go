package httpapi

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// errReviewsBusy is a review that cannot be made now: its caller already has its share waiting
// or under review, the queue is full of others' fair shares, or its turn did not come within
// the wait. The caller gets 429 with Retry-After.
var errReviewsBusy = errors.New("too many requests are being reviewed; retry later")

// fairQueue hands out turns to make a review: at most rate turns a second, at most seats held
// at once, round-robin among groups and, within a group, among flows. A flow is one caller (a
// connection for a credential never seen, a user for an authorization); a group is what
// several flows share (a client address). So whatever one flow or group has queued, another's
// next turn waits for at most one turn of each other group with waiters, and none of them
// waits on a rate it does not share fairly.
//
// Every bound refuses at once rather than waiting: a flow holds at most perFlow requests
// waiting or under review; the queue holds at most maxQueue waiting, and when full, a newcomer
// pushes out the newest waiter of the longest flow if that flow is longer than its own; a
// waiter whose turn has not come within maxWait leaves. Run gives out the turns; without it
// running, every waiter leaves after maxWait.
type fairQueue struct {
	limiter  *rate.Limiter
	seats    int
	perFlow  int
	maxQueue int
	maxWait  time.Duration
	signal   chan struct{} // a waiter arrived or a seat came free

	mu      sync.Mutex
	held    int
	waiting int
	groups  []*queueGroup // in round-robin order, next first
}

type queueGroup struct {
	name  string
	flows []*queueFlow // in round-robin order, next first
}

type queueFlow struct {
	name    string
	waiters []*waiter
	held    int
}

// waiter is one request waiting for its turn; ready is closed when it is granted or pushed out.
type waiter struct {
	ready   chan struct{}
	granted bool
}

func newFairQueue(limiter *rate.Limiter, seats, perFlow, maxQueue int, maxWait time.Duration) *fairQueue {
	return &fairQueue{limiter: limiter, seats: seats, perFlow: perFlow, maxQueue: maxQueue, maxWait: maxWait, signal: make(chan struct{}, 1)}
}

// wait waits for a turn of flow in group, and returns the function that gives it back. It
// returns errReviewsBusy when a bound refuses the request or the wait passes, and ctx's error
// when ctx ends first.
func (q *fairQueue) wait(ctx context.Context, group, flow string) (done func(), err error) {
	w := &waiter{ready: make(chan struct{})}
	q.mu.Lock()
	g, f := q.find(group, flow)
	if len(f.waiters)+f.held >= q.perFlow || !q.makeRoom(f) {
		q.tidy(g, f)
		q.mu.Unlock()
		return nil, errReviewsBusy
	}
	f.waiters = append(f.waiters, w)
	q.waiting++
	q.mu.Unlock()
	q.poke()

	timer := time.NewTimer(q.maxWait)
	defer timer.Stop()
	select {
	case <-w.ready:
	case <-timer.C:
	case <-ctx.Done():
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !w.granted {
		if i := slices.Index(f.waiters, w); i >= 0 { // not pushed out: it leaves
			f.waiters = slices.Delete(f.waiters, i, i+1)
			q.waiting--
		}
		q.tidy(g, f)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return nil, errReviewsBusy
	}
	return func() { q.release(g, f) }, nil
}

// Run gives out turns as the rate and the seats allow, until ctx ends.
func (q *fairQueue) Run(ctx context.Context) error {
	for {
		for !q.grantable() {
			select {
			case <-q.signal:
			case <-ctx.Done():
				return nil
			}
		}
		if q.limiter.Wait(ctx) != nil {
			return nil
		}
		q.grantNext()
	}
}

func (q *fairQueue) poke() {
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *fairQueue) grantable() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiting > 0 && q.held < q.seats
}

// grantNext gives the next turn: to the first waiter of the next flow with waiters in the
// next group with waiters. A flow or group served goes to the back of its round.
func (q *fairQueue) grantNext() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.held >= q.seats {
		return
	}
	for gi, g := range q.groups {
		for fi, f := range g.flows {
			if len(f.waiters) == 0 {
				continue
			}
			w := f.waiters[0]
			f.waiters = slices.Delete(f.waiters, 0, 1)
			w.granted = true
			close(w.ready)
			f.held++
			q.held++
			q.waiting--
			g.flows = append(slices.Delete(g.flows, fi, fi+1), f)
			q.groups = append(slices.Delete(q.groups, gi, gi+1), g)
			return
		}
	}
}

func (q *fairQueue) release(g *queueGroup, f *queueFlow) {
	q.mu.Lock()
	f.held--
	q.held--
	q.tidy(g, f)
	q.mu.Unlock()
	q.poke()
}

// makeRoom says whether f may queue one more waiter: there is room, or the longest flow is
// longer than f will be and gives up its newest waiter.
func (q *fairQueue) makeRoom(f *queueFlow) bool {
	if q.waiting < q.maxQueue {
		return true
	}
	var longest *queueFlow
	for _, g := range q.groups {
		for _, o := range g.flows {
			if longest == nil || len(o.waiters) > len(longest.waiters) {
				longest = o
			}
		}
	}
	if longest == nil || len(longest.waiters) <= len(f.waiters)+1 {
		return false
	}
	pushed := longest.waiters[len(longest.waiters)-1]
	longest.waiters = longest.waiters[:len(longest.waiters)-1]
	q.waiting--
	close(pushed.ready) // not granted: it answers errReviewsBusy
	return true
}

// find returns the group and flow named, added at the back of their rounds if new.
func (q *fairQueue) find(group, flow string) (*queueGroup, *queueFlow) {
	i := slices.IndexFunc(q.groups, func(g *queueGroup) bool { return g.name == group })
	if i < 0 {
		q.groups = append(q.groups, &queueGroup{name: group})
		i = len(q.groups) - 1
	}
	g := q.groups[i]
	j := slices.IndexFunc(g.flows, func(f *queueFlow) bool { return f.name == flow })
	if j < 0 {
		g.flows = append(g.flows, &queueFlow{name: flow})
		j = len(g.flows) - 1
	}
	return g, g.flows[j]
}

// tidy forgets f once it has nothing waiting or held, and g once it has no flow.
func (q *fairQueue) tidy(g *queueGroup, f *queueFlow) {
	if len(f.waiters) > 0 || f.held > 0 {
		return
	}
	g.flows = slices.DeleteFunc(g.flows, func(o *queueFlow) bool { return o == f })
	if len(g.flows) == 0 {
		q.groups = slices.DeleteFunc(q.groups, func(o *queueGroup) bool { return o == g })
	}
}
