package validate

import (
	"slices"
	"testing"
)

// history is the reference: changes in two namespaces, of which the streams select "ns".
var history = History{
	{Added, "ns/a", 10, false, ""},
	{Added, "ns/b", 11, false, ""},
	{Modified, "ns/a", 12, false, ""},
	{Added, "other/c", 13, false, ""},
	{Deleted, "ns/b", 14, false, ""},
	{Modified, "ns/a", 15, false, ""},
	{Added, "ns/d", 16, false, ""},
}

// inNS selects the objects of namespace "ns".
var inNS = Selector{Namespace: "ns"}

// resumed is a watch opened at 11 that received everything, with a bookmark on the way.
func resumed() Stream {
	return Stream{Name: "resumed", From: 11, Selects: inNS, Events: []Event{
		{Modified, "ns/a", 12, false, ""},
		{Bookmark, "", 13, false, ""},
		{Deleted, "ns/b", 14, false, ""},
		{Modified, "ns/a", 15, false, ""},
		{Added, "ns/d", 16, false, ""},
	}}
}

// initial is a watch that asked for initial events and received the state at 13, then the rest.
func initial() Stream {
	return Stream{Name: "initial", SendInitialEvents: true, Selects: inNS, Events: []Event{
		{Added, "ns/b", 11, false, ""},
		{Added, "ns/a", 12, false, ""},
		{Bookmark, "", 13, true, ""},
		{Deleted, "ns/b", 14, false, ""},
		{Modified, "ns/a", 15, false, ""},
		{Added, "ns/d", 16, false, ""},
	}}
}

// relabelled is the reference of a label-selected watch: ns/a is relabelled out of team=a and
// back in, changed while out, and deleted; ns/b never selected.
var relabelled = History{
	{Added, "ns/a", 10, false, "team=a"},
	{Added, "ns/b", 11, false, "team=b"},
	{Modified, "ns/a", 12, false, "team=b"},
	{Modified, "ns/a", 13, false, "team=b"},
	{Modified, "ns/a", 14, false, "team=a"},
	{Deleted, "ns/a", 15, false, "team=a"},
}

// teamA is a watch of team=a from 10 that received what the apiserver sends: the object that
// leaves DELETED as it was, at the change's resourceVersion; back, ADDED.
func teamA() Stream {
	return Stream{Name: "team=a", From: 10, Selects: Selector{Labels: "team=a"}, Events: []Event{
		{Deleted, "ns/a", 12, false, "team=a"},
		{Added, "ns/a", 14, false, "team=a"},
		{Deleted, "ns/a", 15, false, "team=a"},
	}}
}

func TestAStreamThatKeepsEveryPromisePassesEveryValidator(t *testing.T) {
	if v := Watch(relabelled, teamA()); len(v) > 0 {
		t.Errorf("team=a: %v; want none", v)
	}
	for _, s := range []Stream{resumed(), initial(), {Name: "from now", Selects: inNS, Events: resumed().Events[2:]}} {
		if v := Watch(history, s); len(v) > 0 {
			t.Errorf("%s: %v; want none", s.Name, v)
		}
	}
}

// TestEachValidatorFailsOnTheStreamThatBreaksItsPromise: every validator finds what it is
// for; one that never failed would check nothing.
func TestEachValidatorFailsOnTheStreamThatBreaksItsPromise(t *testing.T) {
	at20 := append(slices.Clone(history), Event{Added, "ns/x", 20, false, ""}, Event{Added, "ns/y", 20, false, ""}) // a selection's change: two objects at once
	for _, tt := range []struct {
		name      string
		history   History
		stream    Stream
		validator string
	}{
		{"two changes swapped", history, edit(resumed(), func(e []Event) []Event { e[2], e[3] = e[3], e[2]; return e }), "Ordered"},
		{"a change twice", history, edit(resumed(), func(e []Event) []Event { return append(e, e[3]) }), "Unique"},
		{"one of two changes at one resourceVersion", at20, edit(resumed(), func(e []Event) []Event { return append(e, Event{Added, "ns/x", 20, false, ""}) }), "Atomic"},
		{"a bookmark between two changes at one resourceVersion", at20, edit(resumed(), func(e []Event) []Event {
			return append(e, Event{Added, "ns/x", 20, false, ""}, Event{Bookmark, "", 20, false, ""}, Event{Added, "ns/y", 20, false, ""})
		}), "Atomic"},
		{"a bookmark ahead of a change", history, edit(resumed(), func(e []Event) []Event { e[1].Revision = 15; return e }), "Bookmarkable"},
		{"a bookmark behind a change", history, edit(resumed(), func(e []Event) []Event { e[1].Revision = 11; return e }), "Bookmarkable"},
		{"an initial events' bookmark older than an initial event", history, edit(initial(), func(e []Event) []Event { e[1].Revision = 15; return e }), "Bookmarkable"},
		{"a change missing in the middle", history, edit(resumed(), func(e []Event) []Event { return slices.Delete(e, 2, 3) }), "Reliable"},
		{"a creation sent as a modification", history, edit(resumed(), func(e []Event) []Event { e[4].Type = Modified; return e }), "Reliable"},
		{"a change of an object not selected", history, edit(resumed(), func(e []Event) []Event { return slices.Insert(e, 2, Event{Added, "other/c", 13, false, ""}) }), "Reliable"},
		{"the first change after the resourceVersion missing", history, edit(resumed(), func(e []Event) []Event { return e[1:] }), "Resumable"},
		{"a change from before the resourceVersion", history, edit(resumed(), func(e []Event) []Event { return slices.Insert(e, 0, Event{Added, "ns/b", 11, false, ""}) }), "Resumable"},
		{"a change the history never had", history, edit(resumed(), func(e []Event) []Event { return append(e, Event{Modified, "ns/d", 17, false, ""}) }), "Resumable"},
		{"an initial object at an older version", history, edit(initial(), func(e []Event) []Event { e[1].Revision = 10; return e }), "InitialState"},
		{"an initial object missing", history, edit(initial(), func(e []Event) []Event { return e[1:] }), "InitialState"},
		{"an initial object that was deleted", history, edit(initial(), func(e []Event) []Event { e[2].Revision = 14; return slices.Delete(e, 3, 4) }), "InitialState"},
		{"no initial events' bookmark", history, edit(initial(), func(e []Event) []Event { e[2].InitialEventsEnd = false; return e }), "InitialState"},
		{"an object relabelled out of the selection not DELETED", relabelled, edit(teamA(), func(e []Event) []Event { return e[1:] }), "Resumable"},
		{"an object relabelled out DELETED as it is now", relabelled, edit(teamA(), func(e []Event) []Event { e[0].Labels = "team=b"; return e }), "Reliable"},
		{"an object relabelled back in MODIFIED", relabelled, edit(teamA(), func(e []Event) []Event { e[1].Type = Modified; return e }), "Reliable"},
		{"a change while out of the selection sent", relabelled, edit(teamA(), func(e []Event) []Event {
			return slices.Insert(e, 1, Event{Modified, "ns/a", 13, false, "team=b"})
		}), "Reliable"},
	} {
		t.Run(tt.name, func(t *testing.T) { wantViolation(t, Watch(tt.history, tt.stream), tt.validator) })
	}
}

// wantViolation fails the test unless v has one of validator's, and logs v.
func wantViolation(t *testing.T, v []Violation, validator string) {
	t.Helper()
	if !slices.ContainsFunc(v, func(v Violation) bool { return v.Validator == validator }) {
		t.Fatalf("violations %v; want one of %s", v, validator)
	}
	t.Log(v)
}

// edit is s with its events changed by f, on a copy.
func edit(s Stream, f func([]Event) []Event) Stream {
	s.Events = f(slices.Clone(s.Events))
	return s
}
