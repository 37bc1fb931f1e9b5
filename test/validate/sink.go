package validate

import (
	"fmt"
	"slices"
	"strings"
)

// Delivery is one event a sink received, in the order the receiver saw them.
type Delivery struct {
	ID       string // the webhook-id or ce-id
	Type     string // ADDED, MODIFIED or DELETED
	Key      string
	Revision uint64
	// Refused: the receiver did not take it (it answered other than 2xx, or after the sink had
	// given up). It counts for order and ids, not as delivered: it must come again.
	Refused bool `json:",omitempty"`
	// Cluster is the cluster it names (ce-cluster).
	Cluster string `json:",omitempty"`
	// Managers are the field managers it names (its payload's managers), sorted, joined by
	// commas; Attributed reads it only where Named is set.
	Managers string `json:",omitempty"`
	Named    bool   `json:",omitempty"`
}

func (d Delivery) String() string {
	return fmt.Sprintf("%s %s %d (id %s)", d.Type, d.Key, d.Revision, d.ID)
}

// Sink is what one sink received.
type Sink struct {
	Name string
	// Selects is which objects the sink's resources and filters select, by key: its Labels
	// are not read (a delivery's labels are not recorded).
	Selects Selector
	// Deliveries are what it received, repeats included, in order of arrival.
	Deliveries []Delivery
	// Gaps are where dynwatch could not follow the changes one by one (its watch could not
	// resume, and it listed again): see Delivered.
	Gaps []Gap
	// Cluster is the cluster every delivery must name; empty: not checked.
	Cluster string `json:",omitempty"`
	// Attribution is, by version (Version), who the history says made it; nil: not checked.
	Attribution map[string]Attribution `json:",omitempty"`
	// ExactManagers: dynwatch followed every change of the run one by one from the start (no
	// restart), so each delivery names exactly who made its version (see Attributed).
	ExactManagers bool `json:",omitempty"`
}

// Attribution is who made one version of an object, from its managedFields in the apiserver's
// history: the managers whose entries changed at it (an entry new since the version before, or
// whose time or apiVersion moved; when none did, those whose fields changed), and every manager
// with an entry in it, each sorted and joined by commas.
type Attribution struct {
	Changed, Present string
}

// Version names the version rev of the object key in an Attribution.
func Version(key string, rev uint64) string { return fmt.Sprintf("%s@%d", key, rev) }

// Gap is a stretch of revisions, after From and up to To, in which dynwatch's informer lost its
// watch and listed again. A list shows each object as it is: a version that a later one replaced
// within the gap may never be delivered, and a deletion may carry any version of the object
// since its creation (the last one dynwatch saw).
type Gap struct {
	From, To uint64
}

// skipped reports whether e, of history h, may be missing: a gap holds it and the object's
// next change.
func (s Sink) skipped(e Event, h History) bool {
	for _, g := range s.Gaps {
		if e.Revision <= g.From || e.Revision > g.To {
			continue
		}
		for _, n := range h {
			if n.Key == e.Key && n.Revision > e.Revision {
				return n.Revision <= g.To
			}
		}
	}
	return false
}

func (s Sink) matches(key string) bool {
	by := s.Selects
	by.Labels = ""
	return by.Matches(Event{Key: key})
}

// Deliveries runs every sink validator but Delivered over s against h: the promises that hold
// whatever happened on the way (restarts, relists, handovers).
func Deliveries(h History, s Sink) []Violation {
	var out []Violation
	for _, check := range []func(History, Sink) []Violation{Converged, InOrder, StableIDs, Known, Attributed} {
		out = append(out, check(h, s)...)
	}
	return out
}

// Delivered reports each change of a selected object in the history that the sink never
// received, or only refused: each version (ADDED and MODIFIED standing for each other, as
// Known says), and each deletion (as endsAs says), save a version a gap skipped (see Gap).
func Delivered(h History, s Sink) []Violation {
	var out []Violation
	for _, e := range h {
		if !s.matches(e.Key) || s.skipped(e, h) {
			continue
		}
		if !slices.ContainsFunc(s.Deliveries, func(d Delivery) bool { return !d.Refused && d.Key == e.Key && endsAs(d, e, h, s.Gaps) }) {
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
		if !slices.ContainsFunc(s.Deliveries, func(d Delivery) bool { return !d.Refused && d.Key == key && endsAs(d, e, h, s.Gaps) }) {
			out = append(out, Violation{"Converged", s.Name, -1, fmt.Sprintf("%s, the object's last state, never arrived", e)})
		}
	}
	return out
}

// endsAs reports whether d delivers the state e left its object in: the same version, or, for a
// deletion, a DELETED at the deletion's revision or at a version of the object since its
// creation (a deletion found by a relist or a restart carries the object as it was last seen),
// or at an earlier version or deletion when every change of the object since then is in one of
// gaps (a list then sees the object gone, whatever lives it had in between).
func endsAs(d Delivery, e Event, h History, gaps []Gap) bool {
	if e.Type != Deleted {
		return d.Type != Deleted && d.Revision == e.Revision
	}
	if d.Type != Deleted {
		return false
	}
	if d.Revision == e.Revision || slices.Contains(h.lifeBefore(e), d.Revision) {
		return true
	}
	return slices.ContainsFunc(h, func(v Event) bool { return v.Key == e.Key && v.Revision == d.Revision }) &&
		slices.ContainsFunc(gaps, func(g Gap) bool { return g.holds(h, e.Key, d.Revision, e.Revision) })
}

// holds reports whether every change of the object key after revision from and up to to is in
// the gap.
func (g Gap) holds(h History, key string, from, to uint64) bool {
	for _, v := range h {
		if v.Key == key && v.Revision > from && v.Revision <= to && (v.Revision <= g.From || v.Revision > g.To) {
			return false
		}
	}
	return true
}

// lifeBefore is the revisions of the versions of e's object, since its creation, before e.
func (h History) lifeBefore(e Event) []uint64 {
	var revs []uint64
	for _, o := range h {
		switch {
		case o.Key != e.Key || o.Revision >= e.Revision:
		case o.Type == Deleted:
			revs = revs[:0] // an earlier life
		default:
			revs = append(revs, o.Revision)
		}
	}
	return revs
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
// which an object's change is); a DELETED is of the deletion's revision or of a version of the
// object since its creation.
func Known(h History, s Sink) []Violation {
	var out []Violation
	for i, d := range s.Deliveries {
		if !s.matches(d.Key) {
			out = append(out, Violation{"Known", s.Name, i, fmt.Sprintf("%s, an object the sink does not select", d)})
			continue
		}
		if !slices.ContainsFunc(h, func(e Event) bool { return e.Key == d.Key && knownAs(d, e, h, s.Gaps) }) {
			out = append(out, Violation{"Known", s.Name, i, fmt.Sprintf("%s, a version the history never had", d)})
		}
	}
	return out
}

func knownAs(d Delivery, e Event, h History, gaps []Gap) bool {
	if d.Type == Deleted {
		return e.Type == Deleted && endsAs(d, e, h, gaps)
	}
	return e.Type != Deleted && e.Revision == d.Revision
}

// Attributed reports a delivery that names another cluster than the sink's, and a delivery of a
// version the history made (ADDED or MODIFIED) that names a field manager the version has no
// entry of. With ExactManagers it also reports one that names other managers than those who
// made the version, unless a gap holds it (a relist compares the object with a version from
// before the gap) or it delivers as ADDED a version the history modified (an initial list names
// every manager of the object as it stands).
func Attributed(h History, s Sink) []Violation {
	var out []Violation
	for i, d := range s.Deliveries {
		if s.Cluster != "" && d.Cluster != s.Cluster {
			out = append(out, Violation{"Attributed", s.Name, i, fmt.Sprintf("%s names cluster %q, not %q", d, d.Cluster, s.Cluster)})
		}
		a, ok := s.Attribution[Version(d.Key, d.Revision)]
		if !ok || !d.Named || d.Type == Deleted {
			continue
		}
		if extra := unnamed(d.Managers, a.Present); extra != "" {
			out = append(out, Violation{"Attributed", s.Name, i, fmt.Sprintf("%s names %s, who has no entry in that version (it has %s)", d, extra, a.Present)})
			continue
		}
		if !s.ExactManagers || d.Managers == a.Changed || s.inGap(d.Revision) || d.Type == Added && !h.added(d.Key, d.Revision) {
			continue
		}
		out = append(out, Violation{"Attributed", s.Name, i, fmt.Sprintf("%s names %q, but %q made that version", d, d.Managers, a.Changed)})
	}
	return out
}

// unnamed is the first of the comma-joined names that all does not hold, "" when it holds
// every one.
func unnamed(names, all string) string {
	if names == "" {
		return ""
	}
	have := strings.Split(all, ",")
	for _, n := range strings.Split(names, ",") {
		if !slices.Contains(have, n) {
			return n
		}
	}
	return ""
}

// inGap reports whether a gap holds revision rev.
func (s Sink) inGap(rev uint64) bool {
	return slices.ContainsFunc(s.Gaps, func(g Gap) bool { return rev > g.From && rev <= g.To })
}

// added reports whether the history created key's object at rev.
func (h History) added(key string, rev uint64) bool {
	return slices.ContainsFunc(h, func(e Event) bool { return e.Key == key && e.Revision == rev && e.Type == Added })
}
