// Package validate checks recorded history against the guarantees dynwatch makes, with the
// reference history the apiserver recorded of the same resource: each watch stream a test
// recorded through the query API, with the validators etcd's robustness suite holds its watch
// to (Ordered, Unique, Atomic, Bookmarkable, Reliable, Resumable) and the initial state a watch
// asked for with sendInitialEvents (watch.go); each paged list, its pages at one
// resourceVersion and together the state the history had there (list.go); and what each sink
// received (sink.go): every change delivered, or at least each object's last state, first
// arrivals in order per object, one id per change, and no version the apiserver never had.
//
// Vocabulary: a History is every change of one resource as the apiserver made it, in
// resourceVersion order (a watch on the apiserver opened before the changes, or its Exact
// lists). A Stream is one watch as a client received it: where it was opened, which objects it
// selects and every event it received, bookmarks included. Each validator returns one
// Violation per broken promise, naming the stream's event by its index, and nil when the
// promise holds. A stream's or a list's Selector sees an object's key and labels, so an object
// that moves into or out of a label selector is checked as the apiserver's watch sends it
// (History.View).
package validate

import (
	"fmt"
	"slices"
)

// Event types, as a watch sends them.
const (
	Added    = "ADDED"
	Modified = "MODIFIED"
	Deleted  = "DELETED"
	Bookmark = "BOOKMARK"
)

// Event is one change, or one bookmark, as recorded; a watch's ERROR event (a 410 that ends
// it) is not one.
type Event struct {
	Type string
	// Key is the object's namespace/name ("name" when cluster-scoped); empty for a bookmark.
	Key string
	// Revision is the object's resourceVersion in the event, or the bookmark's.
	Revision uint64
	// InitialEventsEnd marks the bookmark that ends a watch's initial events (the
	// k8s.io/initial-events-end annotation).
	InitialEventsEnd bool
	// Labels are the object's labels in the event, as key=value pairs in key order joined by
	// commas (labels.Set's String), for streams that select by them.
	Labels string
}

func (e Event) String() string {
	if e.Type == Bookmark {
		if e.InitialEventsEnd {
			return fmt.Sprintf("BOOKMARK %d (initial events end)", e.Revision)
		}
		return fmt.Sprintf("BOOKMARK %d", e.Revision)
	}
	if e.Labels != "" {
		return fmt.Sprintf("%s %s %d {%s}", e.Type, e.Key, e.Revision, e.Labels)
	}
	return fmt.Sprintf("%s %s %d", e.Type, e.Key, e.Revision)
}

// History is every change of one resource, in resourceVersion order, without bookmarks.
type History []Event

// Stream is one watch as recorded.
type Stream struct {
	// Name names the stream in violations.
	Name string
	// From is the resourceVersion the watch was opened at; 0 with SendInitialEvents.
	From uint64
	// SendInitialEvents: the watch asked for the current objects first, ended by the initial
	// events' bookmark.
	SendInitialEvents bool
	// Selects is which objects the watch selects, as a change left each (its key and labels).
	// An object that comes to match is ADDED to the stream, and one that stops matching
	// DELETED (see History.View).
	Selects Selector
	// Events are what the watch received, in order.
	Events []Event
}

// Violation is one broken promise.
type Violation struct {
	Validator string // Ordered, Unique, Atomic, Bookmarkable, Reliable, Resumable, InitialState
	Stream    string
	Index     int // of the stream's event it concerns; -1 for the stream as a whole
	Detail    string
}

func (v Violation) String() string {
	if v.Index < 0 {
		return fmt.Sprintf("%s: %s: %s", v.Validator, v.Stream, v.Detail)
	}
	return fmt.Sprintf("%s: %s, event %d: %s", v.Validator, v.Stream, v.Index, v.Detail)
}

// Watch runs every validator over s against h.
func Watch(h History, s Stream) []Violation {
	var out []Violation
	for _, check := range []func(History, Stream) []Violation{Ordered, Unique, Atomic, Bookmarkable, Reliable, Resumable, InitialState} {
		out = append(out, check(h, s)...)
	}
	return out
}

// changes are the stream's events after its initial ones, bookmarks left out, each with its
// index in the stream.
func (s Stream) changes() (idx []int, evs []Event) {
	for i, e := range s.Events[s.initialEnd():] {
		if e.Type != Bookmark {
			idx, evs = append(idx, s.initialEnd()+i), append(evs, e)
		}
	}
	return idx, evs
}

// initialEnd is the index of the first event after the initial events' bookmark; 0 without
// initial events, or when the bookmark never came.
func (s Stream) initialEnd() int {
	if !s.SendInitialEvents {
		return 0
	}
	for i, e := range s.Events {
		if e.Type == Bookmark && e.InitialEventsEnd {
			return i + 1
		}
	}
	return 0
}

// start is the resourceVersion the stream's changes follow: From, or with initial events
// their bookmark's; false when a stream with initial events never received that bookmark.
func (s Stream) start() (uint64, bool) {
	if !s.SendInitialEvents {
		return s.From, true
	}
	end := s.initialEnd()
	if end == 0 {
		return 0, false
	}
	return s.Events[end-1].Revision, true
}

// View is the history as a watch with s's selection sees it, as the apiserver's watch sends
// it: the changes of the objects it selects; an object updated into the selection ADDED, and
// one updated out of it DELETED, carrying the state the watch last selected at the update's
// resourceVersion.
func (h History) View(s Stream) History {
	if s.Selects.all() {
		return h
	}
	var out History
	last := map[string]Event{} // each object's state after its latest change
	for _, e := range h {
		prev, had := last[e.Key]
		was, now := had && s.Selects.Matches(prev), e.Type != Deleted && s.Selects.Matches(e)
		if e.Type == Deleted {
			delete(last, e.Key)
		} else {
			last[e.Key] = e
		}
		switch {
		case was && now:
			out = append(out, e)
		case now:
			e.Type = Added
			out = append(out, e)
		case was:
			prev.Type, prev.Revision = Deleted, e.Revision
			out = append(out, prev)
		}
	}
	return out
}

// Ordered reports where s breaks this promise: the changes come in resourceVersion order;
// several may share one (objects a selection's change brought in or took out at once), none
// goes back.
func Ordered(_ History, s Stream) []Violation {
	var out []Violation
	idx, evs := s.changes()
	for i := 1; i < len(evs); i++ {
		if evs[i].Revision < evs[i-1].Revision {
			out = append(out, Violation{"Ordered", s.Name, idx[i], fmt.Sprintf("%s after %s", evs[i], evs[i-1])})
		}
	}
	return out
}

// Unique reports where s breaks this promise: no change of an object at a resourceVersion comes
// twice.
func Unique(_ History, s Stream) []Violation {
	var out []Violation
	type at struct {
		key string
		rev uint64
	}
	seen := map[at]int{}
	idx, evs := s.changes()
	for i, e := range evs {
		if first, ok := seen[at{e.Key, e.Revision}]; ok {
			out = append(out, Violation{"Unique", s.Name, idx[i], fmt.Sprintf("%s again (first at event %d)", e, first)})
			continue
		}
		seen[at{e.Key, e.Revision}] = idx[i]
	}
	return out
}

// Atomic reports where s breaks this promise: a stream that has a change at a resourceVersion
// has every change the history has there for the objects it selects, together: no event of
// another resourceVersion, and no bookmark, comes between them.
func Atomic(h History, s Stream) []Violation {
	var out []Violation
	events, seen := s.Events[s.initialEnd():], h.View(s)
	for i := 0; i < len(events); {
		if events[i].Type == Bookmark {
			i++
			continue
		}
		rev, j := events[i].Revision, i
		got := map[string]bool{}
		for ; j < len(events) && events[j].Type != Bookmark && events[j].Revision == rev; j++ {
			got[events[j].Key] = true
		}
		for _, e := range seen {
			if e.Revision == rev && !got[e.Key] {
				out = append(out, Violation{"Atomic", s.Name, s.initialEnd() + i, fmt.Sprintf("%s is missing from the changes at %d", e, rev)})
			}
		}
		i = j
	}
	return out
}

// Bookmarkable reports where s breaks this promise: a bookmark's resourceVersion is at or after
// every change before it, and before every change after it, so that a watch resumed from it
// misses nothing and repeats nothing. The initial events' bookmark is at or after every initial
// event; a bookmark among the initial events, which come in no order of resourceVersion, is not
// checked.
func Bookmarkable(_ History, s Stream) []Violation {
	var out []Violation
	for i, b := range s.Events {
		if b.Type != Bookmark || i < s.initialEnd()-1 {
			continue
		}
		for j, e := range s.Events {
			if e.Type == Bookmark {
				continue
			}
			if j < i && e.Revision > b.Revision {
				out = append(out, Violation{"Bookmarkable", s.Name, i, fmt.Sprintf("%s follows %s at event %d", b, e, j)})
				break
			}
			if j > i && e.Revision <= b.Revision {
				out = append(out, Violation{"Bookmarkable", s.Name, i, fmt.Sprintf("%s is followed by %s at event %d", b, e, j)})
				break
			}
		}
	}
	return out
}

// Reliable reports where s breaks this promise: between the stream's first change and its last,
// it has every change the history has for the objects it selects, of the same type: no gap.
func Reliable(h History, s Stream) []Violation {
	idx, evs := s.changes()
	if len(evs) == 0 {
		return nil
	}
	first, last := evs[0].Revision, evs[len(evs)-1].Revision
	return gaps("Reliable", s, idx, evs, h.between(max(first, 1)-1, last, s))
}

// Resumable reports where s breaks this promise: a watch opened at a resourceVersion (or whose
// initial events ended at one) starts with the first change after it, and from there misses
// none up to the last resourceVersion it received, a bookmark's included.
func Resumable(h History, s Stream) []Violation {
	from, ok := s.start()
	if !ok || (!s.SendInitialEvents && from == 0) {
		return nil // a watch from "now" has no resourceVersion to resume from
	}
	idx, evs := s.changes()
	last := from
	for _, e := range s.Events[s.initialEnd():] {
		last = max(last, e.Revision)
	}
	return gaps("Resumable", s, idx, evs, h.between(from, last, s))
}

// between is the history's changes after from, up to and including to, as s sees them (View).
func (h History) between(from, to uint64, s Stream) []Event {
	var out []Event
	for _, e := range h.View(s) {
		if e.Revision > from && e.Revision <= to {
			out = append(out, e)
		}
	}
	return out
}

// gaps compares what the stream received (evs, at idx in it) with what it should have (want,
// in order), and reports the first difference.
func gaps(validator string, s Stream, idx []int, evs, want []Event) []Violation {
	for i, w := range want {
		switch {
		case i >= len(evs):
			return []Violation{{validator, s.Name, -1, fmt.Sprintf("%s never came (%d of %d changes received)", w, len(evs), len(want))}}
		case evs[i] != w:
			return []Violation{{validator, s.Name, idx[i], fmt.Sprintf("%s where %s was due", evs[i], w)}}
		}
	}
	if len(evs) > len(want) {
		return []Violation{{validator, s.Name, idx[len(want)], fmt.Sprintf("%s, which the history does not have", evs[len(want)])}}
	}
	return nil
}

// InitialState reports where s breaks this promise: a watch that asked for initial events
// receives them, ended by the initial events' bookmark, and they are the objects it selects as
// they stood at that bookmark's resourceVersion: each one ADDED once, at its last version up to
// it.
func InitialState(h History, s Stream) []Violation {
	if !s.SendInitialEvents {
		return nil
	}
	end := s.initialEnd()
	if end == 0 {
		return []Violation{{"InitialState", s.Name, -1, "no bookmark ended the initial events"}}
	}
	at := s.Events[end-1].Revision
	want := map[string]uint64{}
	for _, e := range h.View(s) {
		if e.Revision > at {
			continue
		}
		if e.Type == Deleted {
			delete(want, e.Key)
		} else {
			want[e.Key] = e.Revision
		}
	}
	var out []Violation
	got := map[string]bool{}
	for i, e := range s.Events[:end-1] {
		rev, ok := want[e.Key]
		switch {
		case e.Type != Added:
			out = append(out, Violation{"InitialState", s.Name, i, fmt.Sprintf("%s among the initial events, which are all ADDED", e)})
		case got[e.Key]:
			out = append(out, Violation{"InitialState", s.Name, i, fmt.Sprintf("%s twice", e)})
		case !ok:
			out = append(out, Violation{"InitialState", s.Name, i, fmt.Sprintf("%s, which did not exist at %d", e, at)})
		case rev != e.Revision:
			out = append(out, Violation{"InitialState", s.Name, i, fmt.Sprintf("%s, which was at %d at %d", e, rev, at)})
		}
		got[e.Key] = true
	}
	var missing []string
	for key := range want {
		if !got[key] {
			missing = append(missing, key)
		}
	}
	slices.Sort(missing)
	for _, key := range missing {
		out = append(out, Violation{"InitialState", s.Name, -1, fmt.Sprintf("%s (at %d) is missing from the initial events", key, want[key])})
	}
	return out
}
