package validate

import (
	"fmt"
	"maps"
	"slices"
)

// Page is one page of a list as a client received it.
type Page struct {
	// Revision is the page's resourceVersion.
	Revision uint64
	// Items are its objects, in the order received: each one's Key, Revision and Labels.
	Items []Event
	// Continue: the page had a continue token.
	Continue bool
	// Remaining is its remainingItemCount, nil when it had none.
	Remaining *int64
}

// List is one list as a client received it, page by page, following each page's continue token.
type List struct {
	// Name names the list in violations.
	Name string
	// Selects is which objects the list (its namespace and selectors) selects, as a change
	// left each. With a label or field selector the apiserver counts no remainingItemCount:
	// its count would include objects they leave out.
	Selects Selector
	Pages   []Page
}

// Paged reports where l breaks this promise, as the apiserver's paged lists keep it: every
// page has the first page's resourceVersion; every page but the last has a continue token and,
// when the list has no selectors, a remainingItemCount of the objects after it, and with
// them none; the last page has neither; and the pages' objects,
// in key order, are the objects l selects as the history left them at that resourceVersion,
// each once at its version then. The history must start before the objects existed (a watch
// opened before the first write), so that it holds every object's state.
func Paged(h History, l List) []Violation {
	if len(l.Pages) == 0 {
		return []Violation{{"Paged", l.Name, -1, "no page"}}
	}
	var out []Violation
	at := l.Pages[0].Revision
	var items []Event
	for i, p := range l.Pages {
		last := i == len(l.Pages)-1
		items = append(items, p.Items...)
		switch {
		case p.Revision != at:
			out = append(out, Violation{"Paged", l.Name, i, fmt.Sprintf("page %d at resourceVersion %d, the first page's %d", i, p.Revision, at)})
		case last && (p.Continue || p.Remaining != nil):
			out = append(out, Violation{"Paged", l.Name, i, fmt.Sprintf("the last page has a continue token (%t) or a remainingItemCount (%s)", p.Continue, remaining(p.Remaining))})
		case !last && !p.Continue:
			out = append(out, Violation{"Paged", l.Name, i, fmt.Sprintf("page %d of %d has no continue token", i, len(l.Pages))})
		}
		if !last {
			if after := countAfter(l.Pages[i+1:]); (p.Remaining == nil) != l.Selects.narrowed() || p.Remaining != nil && *p.Remaining != int64(after) {
				out = append(out, Violation{"Paged", l.Name, i, fmt.Sprintf("page %d has remainingItemCount %s; %d objects came after it", i, remaining(p.Remaining), after)})
			}
		}
	}
	return append(out, stateAt(h, l, at, items)...)
}

// remaining is a remainingItemCount as a violation names it.
func remaining(n *int64) string {
	if n == nil {
		return "none"
	}
	return fmt.Sprint(*n)
}

// countAfter is how many objects pages hold.
func countAfter(pages []Page) int {
	n := 0
	for _, p := range pages {
		n += len(p.Items)
	}
	return n
}

// stateAt compares items, a list's objects at resourceVersion at, with the history's state then.
func stateAt(h History, l List, at uint64, items []Event) []Violation {
	var out []Violation
	want := map[string]Event{}
	for _, e := range h.View(Stream{Selects: l.Selects}) {
		if e.Revision > at {
			break
		}
		if e.Type == Deleted {
			delete(want, e.Key)
		} else {
			want[e.Key] = e
		}
	}
	got := map[string]bool{}
	for i, it := range items {
		w, ok := want[it.Key]
		switch {
		case i > 0 && it.Key <= items[i-1].Key:
			out = append(out, Violation{"Paged", l.Name, -1, fmt.Sprintf("object %d, %s, comes after %s: not in key order, or twice", i, it.Key, items[i-1].Key)})
		case !ok:
			out = append(out, Violation{"Paged", l.Name, -1, fmt.Sprintf("object %d, %s at %d, did not exist at %d", i, it.Key, it.Revision, at)})
		case w.Revision != it.Revision || w.Labels != it.Labels:
			out = append(out, Violation{"Paged", l.Name, -1, fmt.Sprintf("object %d, %s at %d {%s}, was at %d {%s} at %d", i, it.Key, it.Revision, it.Labels, w.Revision, w.Labels, at)})
		}
		got[it.Key] = true
	}
	for _, key := range slices.Sorted(maps.Keys(want)) {
		if !got[key] {
			out = append(out, Violation{"Paged", l.Name, -1, fmt.Sprintf("%s (at %d) is missing from the list at %d", key, want[key].Revision, at)})
		}
	}
	return out
}
