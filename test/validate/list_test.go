package validate

import (
	"slices"
	"testing"
)

// pagedAt13 is a list of "ns" at 13 in pages of one: ns/a at 12, then ns/b at 11.
func pagedAt13() List {
	one := int64(1)
	return List{Name: "paged", Selects: inNS, Pages: []Page{
		{Revision: 13, Items: []Event{{Key: "ns/a", Revision: 12}}, Continue: true, Remaining: &one},
		{Revision: 13, Items: []Event{{Key: "ns/b", Revision: 11}}},
	}}
}

func TestAPagedListThatKeepsItsPromisePasses(t *testing.T) {
	if v := Paged(history, pagedAt13()); len(v) > 0 {
		t.Errorf("%v; want none", v)
	}
	selected := pagedAt13()
	selected.Selects.Labels, selected.Pages[0].Remaining = "team!=z", nil
	if v := Paged(history, selected); len(v) > 0 {
		t.Errorf("with selectors: %v; want none", v)
	}
	whole := List{Name: "at once", Selects: inNS, Pages: []Page{{Revision: 16, Items: []Event{{Key: "ns/a", Revision: 15}, {Key: "ns/d", Revision: 16}}}}}
	if v := Paged(history, whole); len(v) > 0 {
		t.Errorf("%v; want none", v)
	}
}

// TestPagedFailsOnEachListThatBreaksItsPromise: each way a paged list can be wrong is found.
func TestPagedFailsOnEachListThatBreaksItsPromise(t *testing.T) {
	zero := int64(0)
	for _, tt := range []struct {
		name string
		list func(l List) List
	}{
		{"a page at another resourceVersion", func(l List) List { l.Pages[1].Revision = 14; return l }},
		{"a page before the last without a continue token", func(l List) List { l.Pages[0].Continue = false; return l }},
		{"the last page with a continue token", func(l List) List { l.Pages[1].Continue = true; return l }},
		{"a wrong remainingItemCount", func(l List) List { l.Pages[0].Remaining = &zero; return l }},
		{"no remainingItemCount before the last page", func(l List) List { l.Pages[0].Remaining = nil; return l }},
		{"an object missing", func(l List) List { l.Pages[1].Items = nil; return l }},
		{"an object at an older version", func(l List) List { l.Pages[0].Items[0].Revision = 10; return l }},
		{"an object deleted by then", func(l List) List {
			l.Pages[1].Items = append(l.Pages[1].Items, Event{Key: "ns/c", Revision: 9})
			return l
		}},
		{"an object twice", func(l List) List { l.Pages[1].Items = append(l.Pages[1].Items, l.Pages[1].Items[0]); return l }},
		{"objects out of key order", func(l List) List {
			l.Pages[0].Items, l.Pages[1].Items = l.Pages[1].Items, l.Pages[0].Items
			return l
		}},
		{"an object not selected", func(l List) List {
			l.Pages[1].Items = append(l.Pages[1].Items, Event{Key: "other/c", Revision: 13})
			return l
		}},
		{"a remainingItemCount with selectors", func(l List) List { l.Selects.Labels = "team!=z"; return l }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := pagedAt13()
			for i := range l.Pages {
				l.Pages[i].Items = slices.Clone(l.Pages[i].Items)
			}
			wantViolation(t, Paged(history, tt.list(l)), "Paged")
		})
	}
}
