package webhook

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dynwatch/dynwatch/dynamicinformer"
)

// Delivery is one event to deliver to one sink.
type Delivery struct {
	Event dynamicinformer.Event
	// ID identifies the event for idempotency: identical on every redelivery of it.
	ID string
	// Key orders deliveries: those with the same key (the same object) are made one at a time,
	// in the order they were pushed.
	Key      string
	Enqueued time.Time
	// Body is the request body, or nil to build it from Event.
	Body []byte
	// Seq numbers the delivery's outbox entry; 0 when it has none (no state store).
	Seq uint64
	// Deadline ends retrying; zero until the first attempt fails, then kept across restarts.
	Deadline time.Time
}

// ErrFull is returned by Push when the queue holds its capacity.
var ErrFull = errors.New("queue full")

// Queue holds a sink's deliveries until a worker has made them. Implementations are safe for
// concurrent use. The queue itself is in memory; with a state store, every delivery in it
// also has an outbox entry, from which the queue is filled again at the next start.
type Queue interface {
	// Push adds d after every earlier delivery with the same key. It never blocks: it fails
	// with ErrFull when the queue is at capacity.
	Push(d Delivery) error
	// Pop waits for the oldest delivery whose key has none in progress, and marks its key in
	// progress until Done. It fails only when ctx ends.
	Pop(ctx context.Context) (Delivery, error)
	// Done ends the delivery of d, which Pop returned.
	Done(d Delivery)
	// Return puts d, which Pop returned, back at the head of its key, to be delivered again.
	Return(d Delivery)
	// Len is the number of deliveries queued or in progress.
	Len() int
	// Drain removes and returns every delivery not in progress.
	Drain() []Delivery
}

// memoryQueue is a bounded in-memory Queue: a FIFO of ready keys over per-key FIFOs.
type memoryQueue struct {
	capacity int
	wake     chan struct{} // a token for one waiting Pop

	mu       sync.Mutex
	pending  map[string][]Delivery // queued deliveries per key, oldest first
	ready    []string              // keys with pending deliveries and none in progress
	inFlight map[string]bool
	size     int
}

// NewMemoryQueue returns an empty in-memory queue that holds at most capacity deliveries.
func NewMemoryQueue(capacity int) Queue {
	return &memoryQueue{
		capacity: capacity,
		wake:     make(chan struct{}, 1),
		pending:  map[string][]Delivery{},
		inFlight: map[string]bool{},
	}
}

func (q *memoryQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *memoryQueue) Push(d Delivery) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.size >= q.capacity {
		return ErrFull
	}
	q.size++
	if len(q.pending[d.Key]) == 0 && !q.inFlight[d.Key] {
		q.ready = append(q.ready, d.Key)
		q.signal()
	}
	q.pending[d.Key] = append(q.pending[d.Key], d)
	return nil
}

func (q *memoryQueue) Pop(ctx context.Context) (Delivery, error) {
	for {
		q.mu.Lock()
		if len(q.ready) > 0 {
			key := q.ready[0]
			q.ready = q.ready[1:]
			list := q.pending[key]
			d := list[0]
			if len(list) == 1 {
				delete(q.pending, key)
			} else {
				q.pending[key] = list[1:]
			}
			q.inFlight[key] = true
			if len(q.ready) > 0 {
				q.signal() // more work: wake another worker
			}
			q.mu.Unlock()
			return d, nil
		}
		q.mu.Unlock()
		select {
		case <-q.wake:
		case <-ctx.Done():
			return Delivery{}, ctx.Err()
		}
	}
}

func (q *memoryQueue) Done(d Delivery) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.inFlight, d.Key)
	q.size--
	if len(q.pending[d.Key]) > 0 {
		q.ready = append(q.ready, d.Key)
		q.signal()
	}
}

func (q *memoryQueue) Return(d Delivery) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.inFlight, d.Key)
	q.pending[d.Key] = append([]Delivery{d}, q.pending[d.Key]...)
	q.ready = append([]string{d.Key}, q.ready...)
	q.signal()
}

func (q *memoryQueue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.size
}

func (q *memoryQueue) Drain() []Delivery {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []Delivery
	for _, key := range q.ready {
		out = append(out, q.pending[key]...)
		delete(q.pending, key)
	}
	for key, list := range q.pending { // keys in progress
		out = append(out, list...)
		delete(q.pending, key)
	}
	q.ready = nil
	q.size -= len(out)
	return out
}
