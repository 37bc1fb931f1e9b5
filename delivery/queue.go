package delivery

import (
	"container/heap"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

// Delivery is one journal entry on its way to its sink.
type Delivery struct {
	journal.Entry
	// Attempts counts the requests made for the delivery by this process.
	Attempts int
	// Answer is the class of the destination's answer to the last attempt, as its transport
	// puts it (StatusClass, AnswerAck, AnswerRefused); empty when the transport said nothing,
	// for an attempt that got no answer.
	Answer string
	// backoff spaces this delivery's retries; nil until its first failure.
	backoff *backoff.ExponentialBackOff
}

// ErrFull is returned by Push when the queue holds its capacity.
var ErrFull = errors.New("queue full")

// Queue holds a sink's deliveries until a worker has made them: ready keys taken in turns
// between namespaces (see turns) over per-key FIFOs, and a timer heap of keys waiting to
// retry. A key is blocked from the moment one of its deliveries is popped until it is done, so
// deliveries of one key are made one at a time and in order; a delivery waiting to retry keeps
// its key blocked without holding a worker. It is safe for concurrent use.
type Queue struct {
	wake chan struct{} // a token for one waiting Pop

	mu       sync.Mutex
	capacity int
	pending  map[string][]Delivery // queued deliveries per key, oldest first
	ready    turns                 // keys with pending deliveries and none in progress
	blocked  map[string]bool       // keys with a delivery in progress or waiting to retry
	delayed  delayHeap             // keys waiting to retry, soonest first
	size     int
	// free holds the arrays of keys whose one delivery was popped, cleared, for keys pushed
	// next: a storm pushed an array of one 384-byte delivery for nearly every delivery.
	free [][]Delivery
}

// maxFree bounds Queue.free.
const maxFree = 64

// NewQueue returns an empty queue that holds at most capacity deliveries.
func NewQueue(capacity int) *Queue {
	return &Queue{capacity: capacity, wake: make(chan struct{}, 1), pending: map[string][]Delivery{}, blocked: map[string]bool{}}
}

// turns holds ready keys by their namespace (object.OrderingKeyNamespace), oldest first within
// each, and hands them out a namespace at a time in turn. So a sink shared by tenants gives
// each namespace its share of the workers: a burst of one namespace's changes (a namespace
// joining a selection brings all its objects at once, a tenant's bulk update) waits behind the
// other namespaces' one key each, not they behind the whole burst.
type turns struct {
	order []string            // namespaces with ready keys, the next one's turn first
	keys  map[string][]string // namespace → its ready keys, oldest first
	n     int                 // ready keys in all
}

// push makes key ready, after its namespace's others.
func (r *turns) push(key string) { r.add(key, false) }

// pushFront makes key ready first: its namespace's next, and its namespace's turn next.
func (r *turns) pushFront(key string) { r.add(key, true) }

func (r *turns) add(key string, front bool) {
	ns := object.OrderingKeyNamespace(key)
	if r.keys == nil {
		r.keys = map[string][]string{}
	}
	keys, waiting := r.keys[ns]
	if front {
		r.keys[ns] = append([]string{key}, keys...)
		r.order = append([]string{ns}, slices.DeleteFunc(r.order, func(o string) bool { return o == ns })...)
	} else {
		r.keys[ns] = append(keys, key)
		if !waiting {
			r.order = append(r.order, ns)
		}
	}
	r.n++
}

// pop takes the next namespace's oldest ready key; that namespace, if it has more, goes to the
// end of the turns.
func (r *turns) pop() (string, bool) {
	if len(r.order) == 0 {
		return "", false
	}
	ns := r.order[0]
	r.order = r.order[1:]
	keys := r.keys[ns]
	key := keys[0]
	if len(keys) == 1 {
		delete(r.keys, ns)
	} else {
		r.keys[ns] = keys[1:]
		r.order = append(r.order, ns)
	}
	r.n--
	return key, true
}

func (r *turns) len() int { return r.n }

func (q *Queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Push adds d after every earlier delivery with the same key. It never blocks: it fails with
// ErrFull when the queue is at capacity.
func (q *Queue) Push(d Delivery) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.size >= q.capacity {
		return ErrFull
	}
	q.size++
	if len(q.pending[d.Key]) == 0 && !q.blocked[d.Key] {
		q.ready.push(d.Key)
		q.signal()
	}
	list := q.pending[d.Key]
	if n := len(q.free); len(list) == 0 && n > 0 {
		list, q.free = q.free[n-1], q.free[:n-1]
	}
	q.pending[d.Key] = append(list, d)
	return nil
}

// Pop waits for the oldest ready delivery, and blocks its key until Done, Retry or Return.
// It fails only when ctx ends, and then at once, even with deliveries ready: a worker whose
// context has ended and that puts back what it took (the fence lapsed) must not be handed it
// again.
func (q *Queue) Pop(ctx context.Context) (Delivery, error) {
	for {
		if err := ctx.Err(); err != nil {
			return Delivery{}, err
		}
		q.mu.Lock()
		now := time.Now()
		for len(q.delayed) > 0 && !q.delayed[0].at.After(now) {
			key := heap.Pop(&q.delayed).(delayed).key
			delete(q.blocked, key)
			q.ready.push(key)
		}
		if key, ok := q.ready.pop(); ok {
			list := q.pending[key]
			d := list[0]
			if len(list) == 1 {
				delete(q.pending, key)
				clear(list) // it keeps no event alive
				if cap(list) == 1 && len(q.free) < maxFree {
					q.free = append(q.free, list[:0])
				}
			} else {
				q.pending[key] = list[1:]
			}
			q.blocked[key] = true
			if q.ready.len() > 0 || len(q.delayed) > 0 {
				q.signal() // more work, now or later: wake another worker
			}
			q.mu.Unlock()
			return d, nil
		}
		var timer *time.Timer
		var due <-chan time.Time
		if len(q.delayed) > 0 {
			timer = time.NewTimer(q.delayed[0].at.Sub(now))
			due = timer.C
		}
		q.mu.Unlock()
		select {
		case <-q.wake:
		case <-due:
		case <-ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// Done ends the delivery of d, which Pop returned: its key's next delivery is ready.
func (q *Queue) Done(d Delivery) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.blocked, d.Key)
	q.size--
	if len(q.pending[d.Key]) > 0 {
		q.ready.push(d.Key)
		q.signal()
	}
}

// Retry puts d, which Pop returned, back at the head of its key, to be delivered again at at;
// until then its key stays blocked, and every other key flows.
func (q *Queue) Retry(d Delivery, at time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pending[d.Key] = append([]Delivery{d}, q.pending[d.Key]...)
	heap.Push(&q.delayed, delayed{at: at, key: d.Key})
	q.signal() // a waiting Pop may need an earlier timer
}

// Return puts d, which Pop returned, back at the head of its key, ready at once.
func (q *Queue) Return(d Delivery) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.blocked, d.Key)
	q.pending[d.Key] = append([]Delivery{d}, q.pending[d.Key]...)
	q.ready.pushFront(d.Key)
	q.signal()
}

// Len is the number of deliveries queued, waiting to retry or in progress.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.size
}

// Room is how many deliveries Push would still accept.
func (q *Queue) Room() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return max(q.capacity-q.size, 0)
}

// SetCapacity changes the capacity; deliveries already queued stay.
func (q *Queue) SetCapacity(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.capacity = n
}

// Drain removes and returns every delivery not in progress, those waiting to retry included.
func (q *Queue) Drain() []Delivery {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []Delivery
	for key, list := range q.pending {
		out = append(out, list...)
		delete(q.pending, key)
	}
	for _, d := range q.delayed {
		delete(q.blocked, d.key)
	}
	q.ready, q.delayed = turns{}, nil
	q.size -= len(out)
	return out
}

// delayed is a key waiting to retry until at.
type delayed struct {
	at  time.Time
	key string
}

// delayHeap is a container/heap of delayed keys, soonest first.
type delayHeap []delayed

func (h delayHeap) Len() int           { return len(h) }
func (h delayHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h delayHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *delayHeap) Push(x any)        { *h = append(*h, x.(delayed)) }
func (h *delayHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
