package journal

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/object"
)

// An initialState replay hands a sink, as ADDED, every object the informers hold when the
// journal first sees the sink, then every later change of each object after its ADDED. The
// journal decides which sinks replay and keeps the cursor; whoever reads the cache (package
// webhook) hands it the objects a page at a time (ReplayPage), each page read while the
// resource emits nothing, in list order.
//
// The rule for live events: while a sink replays, an event of a resource still to replay is
// not recorded for it, unless it is the resource under way and its object is at or before the
// cursor (the last object replayed). So an object reaches the sink once as ADDED, carrying its
// state when its page was read, and then each of its later changes: the page was read after
// every earlier event had been recorded, and before every later one. Resources that start
// after the replay began are not part of it: their initial lists reach the sink as they reach
// every sink.

// sinkReplay is where a sink stands: the resources still to replay, in order, the first under
// way, and the cache key of the last object of that one replayed ("" for none yet). A sink
// with nothing pending receives every event.
type sinkReplay struct {
	target  Target
	pending []schema.GroupVersionResource
	after   string
}

// replayRecord is a sink's record in the store, under its name in the sinks bucket: what
// remains of its replay. Resources are named as object.ResourceName does.
type replayRecord struct {
	Pending []string `json:"pending,omitempty"`
	After   string   `json:"after,omitempty"`
}

// ReplayStatus is where a sink's replay stands: the resource to page next, and the cache key
// after which to read it ("" from its first object); Done when nothing is left to replay.
type ReplayStatus struct {
	Resource schema.GroupVersionResource
	After    string
	Done     bool
}

// delivers reports whether a live event e is recorded for t, under the rule above.
func (j *Journal) delivers(t Target, e object.Event) bool {
	r := j.sinks[t.Name()]
	if r == nil || r.target != t || len(r.pending) == 0 {
		return true
	}
	switch slices.Index(r.pending, e.Resource) {
	case -1:
		return true
	case 0:
		return r.after != "" && object.CompareKeys(object.KeyOf(e.Object), r.after) <= 0
	default:
		return false
	}
}

// see notes the targets the journal sees for the first time (configured since the last
// batch, or at start), in tx (nil without a store). A target with a record in the store
// resumes where it stands. Any other starts a replay of every resource being watched if it
// asks for its initial state, unless it is one of the first batch's targets on a store with
// no earlier sink records (or without a store): the initial lists hand those every object.
// The first batch also forgets the records of sinks no longer configured.
func (j *Journal) see(tx *txn, targets []Target, b *batch) {
	first := j.first
	j.first = false
	if first && tx != nil {
		forgetRecords(tx, targets)
	}
	for _, t := range targets {
		prev := j.sinks[t.Name()]
		if prev != nil && prev.target == t {
			continue
		}
		r := &sinkReplay{target: t}
		rec, found, err := readRecord(tx, t.Name())
		if err != nil {
			j.m.corrupt.Inc()
			j.log.Error("corrupt initialState record: the sink is taken as replayed", "sink", t.Name(), "err", err)
		}
		switch {
		case found && prev == nil: // a restart: resume
			r.pending, r.after = rec.pending, rec.after
		case !t.InitialState() || first && j.listsCoverAll:
		default:
			r.pending = j.watched(tx)
		}
		j.sinks[t.Name()] = r
		writeRecord(tx, r)
		b.sinks = true
		if len(r.pending) > 0 {
			j.log.Info("initialState: replaying the current objects to a new sink", "sink", t.Name(), "resources", len(r.pending), "after", r.after)
		}
	}
}

// watched lists, in the order of their names, the resources whose informers have started and,
// with a store, those it holds objects of: at start, before any informer has, the resources
// watched before the restart.
func (j *Journal) watched(tx *txn) []schema.GroupVersionResource {
	j.idx.Lock()
	set := maps.Clone(j.progress)
	j.idx.Unlock()
	if tx != nil {
		for _, name := range tx.resources() {
			if gvr, err := object.ParseResourceName(name); err == nil {
				set[gvr] = nil
			}
		}
	}
	return slices.SortedFunc(maps.Keys(set), func(a, b schema.GroupVersionResource) int {
		return strings.Compare(object.ResourceName(a), object.ResourceName(b))
	})
}

// forget drops the replay state of a removed target, so that a sink configured again under its
// name is new.
func (j *Journal) forget(tx *txn, t Target, b *batch) {
	if r := j.sinks[t.Name()]; r == nil || r.target != t {
		return
	}
	delete(j.sinks, t.Name())
	b.sinks = true
	if tx != nil {
		tx.setRecord(t.Name(), nil)
	}
}

// forgetRecords removes the records of sinks that are not among targets.
func forgetRecords(tx *txn, targets []Target) {
	for _, sink := range tx.sinkRecords() {
		if !slices.ContainsFunc(targets, func(t Target) bool { return t.Name() == sink }) {
			tx.setRecord(sink, nil)
		}
	}
}

// storedReplay is a record decoded.
type storedReplay struct {
	pending []schema.GroupVersionResource
	after   string
}

func readRecord(tx *txn, sink string) (storedReplay, bool, error) {
	if tx == nil {
		return storedReplay{}, false, nil
	}
	v, ok := tx.record(sink)
	if !ok {
		return storedReplay{}, false, nil
	}
	var rec replayRecord
	if err := json.Unmarshal(v, &rec); err != nil {
		return storedReplay{}, true, fmt.Errorf("sink %s: %w", sink, err)
	}
	s := storedReplay{after: rec.After}
	for _, name := range rec.Pending {
		gvr, err := object.ParseResourceName(name)
		if err != nil {
			return storedReplay{}, true, fmt.Errorf("sink %s: %w", sink, err)
		}
		s.pending = append(s.pending, gvr)
	}
	return s, true, nil
}

func writeRecord(tx *txn, r *sinkReplay) {
	if tx == nil {
		return
	}
	rec := replayRecord{After: r.after}
	for _, gvr := range r.pending {
		rec.Pending = append(rec.Pending, object.ResourceName(gvr))
	}
	v, _ := json.Marshal(rec) // strings only: it cannot fail
	tx.setRecord(r.target.Name(), v)
}

// cloneSinks copies the replay states, to put back if a transaction fails.
func cloneSinks(sinks map[string]*sinkReplay) map[string]*sinkReplay {
	out := make(map[string]*sinkReplay, len(sinks))
	for name, r := range sinks {
		c := *r
		c.pending = slices.Clone(r.pending)
		out[name] = &c
	}
	return out
}

// publishSinks makes the replay states committed visible to Checkpoints.
func (j *Journal) publishSinks() {
	view := make(map[string]sinkView, len(j.sinks))
	for name, r := range j.sinks {
		v := sinkView{target: r.target}
		for _, gvr := range r.pending {
			if v.replaying == nil {
				v.replaying = map[schema.GroupVersionResource]bool{}
			}
			v.replaying[gvr] = true
		}
		view[name] = v
	}
	j.idx.Lock()
	j.seen = view
	j.idx.Unlock()
}

// sinkView is a committed replay state as Checkpoints reads it: the target seen under the name,
// and the resources it has still to replay.
type sinkView struct {
	target    Target
	replaying map[schema.GroupVersionResource]bool
}

// ReplayStatus reports where t's replay stands, once the journal has seen t and committed what
// it decided; Done if t is not (or no longer) a target. It waits for the journal's goroutine,
// or ctx.
func (j *Journal) ReplayStatus(ctx context.Context, t Target) (ReplayStatus, error) {
	reply := make(chan ReplayStatus, 1)
	j.submit(op{kind: opReplayStatus, control: &control{target: t, status: reply}})
	select {
	case st := <-reply:
		return st, nil
	case <-ctx.Done():
		return ReplayStatus{}, ctx.Err()
	}
}

// ReplayPage records, for t alone, an ADDED of each of objs (the objects of gvr after the
// cursor, in list order, as Resource.Page reads them) that t's filters select, and moves t's
// cursor past them; complete ends the resource's replay. Call it from within Page's fn: with
// workers, it first waits until what they hold is committed, so that every event emitted
// before the page is recorded before it. The channel it returns receives, once the page is
// committed, the number of entries recorded (0 for a page no longer wanted: t removed, or
// the resource not the one under way).
func (j *Journal) ReplayPage(t Target, gvr schema.GroupVersionResource, objs []*object.Object, complete bool) <-chan int {
	if j.pre != nil {
		j.pre.drain()
	}
	done := make(chan int, 1)
	j.submit(op{kind: opReplay, control: &control{target: t, gvr: gvr, objects: objs, complete: complete, replayed: done}})
	return done
}

// Synced reports whether the initial lists of gvr's informers, as last started, have been
// recorded: every object stored before a restart that the lists no longer have has been
// recorded as DELETED.
func (j *Journal) Synced(gvr schema.GroupVersionResource) bool {
	j.idx.Lock()
	defer j.idx.Unlock()
	p := j.progress[gvr]
	return p != nil && p.synced
}

// status is where t's replay stands, in the journal's goroutine.
func (j *Journal) status(t Target) ReplayStatus {
	r := j.sinks[t.Name()]
	if r == nil || r.target != t || len(r.pending) == 0 {
		return ReplayStatus{Done: true}
	}
	return ReplayStatus{Resource: r.pending[0], After: r.after}
}

// applyReplay records a page of t's replay (see ReplayPage). Objects at or before the cursor
// were replayed already, before a restart. It returns how many entries it recorded.
func (j *Journal) applyReplay(tx *txn, o op, b *batch) int {
	r := j.sinks[o.target.Name()]
	if r == nil || r.target != o.target || len(r.pending) == 0 || r.pending[0] != o.gvr {
		return 0
	}
	queued := len(b.out)
	now := j.now()
	for _, u := range o.objects {
		key := object.KeyOf(u)
		if r.after != "" && object.CompareKeys(key, r.after) <= 0 {
			continue
		}
		r.after = key // at the cursor: fanOut records it
		if j.ignores(o.gvr, u) {
			continue
		}
		e := object.Event{Type: object.Added, Resource: o.gvr, Object: u, Observed: now, Revision: object.Revision(u.GetResourceVersion())}
		j.fanOut(tx, []Target{o.target}, e, nil, nil, b)
	}
	if o.complete {
		r.pending, r.after = r.pending[1:], ""
		if len(r.pending) == 0 {
			j.log.Info("initialState: the current objects have been replayed to the sink", "sink", o.target.Name())
		}
	}
	b.sinks = true
	writeRecord(tx, r)
	return len(b.out) - queued
}
