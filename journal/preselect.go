package journal

import (
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/object"
)

// preselected is what the writer would otherwise compute for an event as it was recorded: each
// target's verdict. The writer uses it unless it changes the event (see applyEvent).
type preselected struct {
	verdicts map[Target]verdict
}

type verdict struct {
	selected bool
	err      error
}

// preselector evaluates the targets' filters off the writer, workers at a
// time, so that one tenant's costly object (a large one, a filter near its cost limit) holds up
// only its own events: each object's events are taken one at a time, in the order recorded,
// and the others' go round it. What it finishes goes to the writer in the order it finishes,
// so events of different objects may be committed out of the order they were recorded in; the
// journal's checkpoints stay below every event still here (see pending).
type preselector struct {
	j *Journal

	mu       sync.Mutex
	idle     *sync.Cond                   // signalled when nothing is queued or being evaluated
	work     *sync.Cond                   // signalled when a key is ready
	queues   map[string][]op              // ordering key → its ops, oldest first
	ready    []string                     // keys with ops and no worker on them
	busy     map[string]bool              // keys a worker is on
	revision map[streamRef]map[uint64]int // lowest revisions of events not yet committed, per stream, counted
	count    int                          // ops queued or being evaluated
	stopped  bool
	workers  sync.WaitGroup
}

// streamRef names one informer stream of a resource.
type streamRef struct {
	gvr    schema.GroupVersionResource
	stream string
}

func newPreselector(j *Journal, workers int) *preselector {
	p := &preselector{j: j, queues: map[string][]op{}, busy: map[string]bool{}, revision: map[streamRef]map[uint64]int{}}
	p.idle, p.work = sync.NewCond(&p.mu), sync.NewCond(&p.mu)
	for range workers {
		p.workers.Go(p.run)
	}
	return p
}

// add queues o behind its object's earlier events. It never blocks.
func (p *preselector) add(o op) {
	key := object.OrderingKey(o.event.Resource, o.event.Object.GetNamespace(), o.event.Object.GetName())
	p.mu.Lock()
	defer p.mu.Unlock()
	p.count++
	if low := o.event.Lowest(); low != 0 {
		ref := streamRef{o.event.Resource, o.event.Stream}
		if p.revision[ref] == nil {
			p.revision[ref] = map[uint64]int{}
		}
		p.revision[ref][low]++
	}
	if len(p.queues[key]) == 0 && !p.busy[key] {
		p.ready = append(p.ready, key)
		p.work.Signal()
	}
	p.queues[key] = append(p.queues[key], o)
}

func (p *preselector) run() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		for len(p.ready) == 0 && !p.stopped {
			p.work.Wait()
		}
		if p.stopped {
			return
		}
		key := p.ready[0]
		p.ready = p.ready[1:]
		o := p.queues[key][0]
		p.queues[key] = p.queues[key][1:]
		p.busy[key] = true
		p.mu.Unlock()
		if o.quiet {
			o.pre = &preselected{} // handed to no target: nothing to evaluate
		} else {
			o.pre = p.j.preselect(o.event)
		}
		p.j.submit(o)
		p.mu.Lock()
		delete(p.busy, key)
		if len(p.queues[key]) > 0 {
			p.ready = append(p.ready, key)
			p.work.Signal()
		} else {
			delete(p.queues, key)
		}
	}
}

// committed forgets o once the writer has committed it.
func (p *preselector) committed(o op) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if low := o.event.Lowest(); low != 0 {
		ref := streamRef{o.event.Resource, o.event.Stream}
		if p.revision[ref][low]--; p.revision[ref][low] <= 0 {
			delete(p.revision[ref], low)
		}
		if len(p.revision[ref]) == 0 {
			delete(p.revision, ref)
		}
	}
	if p.count--; p.count == 0 {
		p.idle.Broadcast()
	}
}

// pending is the lowest revision of gvr's stream still to be committed (an event's Lowest:
// relists' and transitions' too, which do not move the stream's progress but are not yet in
// the outbox either); false if none is.
func (p *preselector) pending(gvr schema.GroupVersionResource, stream string) (uint64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	lowest, found := uint64(0), false
	for rev := range p.revision[streamRef{gvr, stream}] {
		if !found || rev < lowest {
			lowest, found = rev, true
		}
	}
	return lowest, found
}

// drain waits until every op added so far has been committed.
func (p *preselector) drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.count > 0 && !p.stopped {
		p.idle.Wait()
	}
}

// stop ends the workers; what is queued stays unevaluated.
func (p *preselector) stop() {
	p.mu.Lock()
	p.stopped = true
	p.work.Broadcast()
	p.idle.Broadcast()
	p.mu.Unlock()
	p.workers.Wait()
}

// preselect computes, for e as recorded, every target's verdict.
func (j *Journal) preselect(e object.Event) *preselected {
	targets := j.targets()
	pre := &preselected{verdicts: make(map[Target]verdict, len(targets))}
	for _, t := range targets {
		selected, err := t.Selects(e)
		pre.verdicts[t] = verdict{selected, err}
	}
	return pre
}

// empty reports whether every op added has been committed.
func (p *preselector) empty() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count == 0
}
