package validate

import (
	"fmt"
	"slices"
)

// Delivery is one event a sink received, in the order the receiver saw them.
type Delivery struct {
	ID       string // the webhook-id or ce-id
	Type     string // ADDED, MODIFIED or DELETED
	Key      string
	Revision uint64
	// Refused: the receiver did not take it (it answered other than 2xx, or after the sink had
	// given up). It counts for order and ids, not as delivered: it must come again.
	Refused bool
}

func (d Delivery) String() string {
	return fmt.Sprintf("%s %s %d (id %s)", d.Type, d.Key, d.Revision, d.ID)
}

// Sink is what one sink received.
type Sink struct {
	Name string
	// Match reports whether the sink's filters select the object key; nil selects every object.
	Match func(key string) bool
	// Deliveries are what it received, repeats included, in order of arrival.
	Deliveries []Delivery
}

func (s Sink) matches(key string) bool { return s.Match == nil || s.Match(key) }

// Deliveries runs every sink validator but Delivered over s against h: the promises that hold
// whatever happened on the way (restarts, relists, handovers).
func Deliveries(h History, s Sink) []Violation {
	var out []Violation
	for _, check := range []func(History, Sink) []Violation{Converged, InOrder, StableIDs, Known} {
		out = append(out, check(h, s)...)
	}
	return out
}

// Delivered reports each change of a selected object in the history that the sink never
// received, or only refused: the promise of a run in which the informers saw every change (no
// relist, no restart; after either, versions made meanwhile may be delivered as one).
func Delivered(h History, s Sink) []Violation {
	type change struct {
		typ, key string
		rev      uint64
	}
	got := map[change]bool{}
	for _, d := range s.Deliveries {
		if !d.Refused {
			got[change{d.Type, d.Key, d.Revision}] = true
		}
	}
	var out []Violation
	for _, e := range h {
		if s.matches(e.Key) && !got[change{e.Type, e.Key, e.Revision}] {
			out = append(out, Violation{"Delivered", s.Name, -1, fmt.Sprintf("%s never arrived", e)})
		}
	}
	return out
}

// Converged reports each selected object whose last state in the history the sink never
// received, or only refused: its last version, or its deletion.
func Converged(h History, s Sink) []Violation {
	last := map[string]Event{}
	var keys []string
	for _, e := range h {
		if !s.matches(e.Key) {
			continue
		}
		if _, ok := last[e.Key]; !ok {
			keys = append(keys, e.Key)
		}
		last[e.Key] = e
	}
	var out []Violation
	for _, key := range keys {
		e := last[key]
		if !slices.ContainsFunc(s.Deliveries, func(d Delivery) bool { return !d.Refused && d.Key == key && endsAs(d, e, h) }) {
			out = append(out, Violation{"Converged", s.Name, -1, fmt.Sprintf("%s, the object's last state, never arrived", e)})
		}
	}
	return out
}

// endsAs reports whether d delivers the last state e: the same version, or, for a deletion,
// a DELETED at the deletion's revision or at the last version before it (a deletion found by a
// relist or a restart carries the object as it was last seen).
func endsAs(d Delivery, e Event, h History) bool {
	if e.Type != Deleted {
		return d.Type != Deleted && d.Revision == e.Revision
	}
	return d.Type == Deleted && (d.Revision == e.Revision || d.Revision == h.before(e))
}

// before is the revision of the version of e's object that e followed; 0 if none.
func (h History) before(e Event) uint64 {
	var rev uint64
	for _, o := range h {
		if o.Key == e.Key && o.Revision < e.Revision {
			rev = o.Revision
		}
	}
	return rev
}

// InOrder reports each object's version that first arrived after a later version of it had:
// per object, first arrivals come in resourceVersion order (repeats may come at any time).
func InOrder(_ History, s Sink) []Violation {
	var out []Violation
	type version struct {
		key string
		rev uint64
	}
	arrived := map[version]bool{}
	newest := map[string]uint64{}
	for i, d := range s.Deliveries {
		v := version{d.Key, d.Revision}
		if arrived[v] {
			continue
		}
		arrived[v] = true
		if n, ok := newest[d.Key]; ok && d.Revision < n {
			out = append(out, Violation{"InOrder", s.Name, i, fmt.Sprintf("%s first arrived after version %d of the object", d, n)})
		}
		newest[d.Key] = max(newest[d.Key], d.Revision)
	}
	return out
}

// StableIDs reports a change that arrived under two ids, and an id that two changes share:
// every repeat carries the first delivery's id, so a receiver can deduplicate on it.
func StableIDs(_ History, s Sink) []Violation {
	var out []Violation
	type change struct {
		typ, key string
		rev      uint64
	}
	ids := map[change]string{}
	owners := map[string]change{}
	for i, d := range s.Deliveries {
		c := change{d.Type, d.Key, d.Revision}
		if id, ok := ids[c]; ok && id != d.ID {
			out = append(out, Violation{"StableIDs", s.Name, i, fmt.Sprintf("%s again under another id (first %s)", d, id)})
			continue
		}
		if o, ok := owners[d.ID]; ok && o != c {
			out = append(out, Violation{"StableIDs", s.Name, i, fmt.Sprintf("%s under the id of %s %s %d", d, o.typ, o.key, o.rev)})
			continue
		}
		ids[c], owners[d.ID] = d.ID, c
	}
	return out
}

// Known reports a delivery of a version the history never had, or of an object the sink does
// not select. ADDED and MODIFIED stand for each other (after a restart the comparison decides
// which an object's change is); a DELETED is of the deletion's revision or of the last version
// before it.
func Known(h History, s Sink) []Violation {
	var out []Violation
	for i, d := range s.Deliveries {
		if !s.matches(d.Key) {
			out = append(out, Violation{"Known", s.Name, i, fmt.Sprintf("%s, an object the sink does not select", d)})
			continue
		}
		if !slices.ContainsFunc(h, func(e Event) bool { return e.Key == d.Key && knownAs(d, e, h) }) {
			out = append(out, Violation{"Known", s.Name, i, fmt.Sprintf("%s, a version the history never had", d)})
		}
	}
	return out
}

func knownAs(d Delivery, e Event, h History) bool {
	if d.Type == Deleted {
		return e.Type == Deleted && (d.Revision == e.Revision || d.Revision == h.before(e))
	}
	return e.Type != Deleted && e.Revision == d.Revision
}
