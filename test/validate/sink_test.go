package validate

import (
	"fmt"
	"slices"
	"testing"
)

// delivered is what a sink selecting "ns" receives when every promise holds: each change once,
// and one repeated later under its first id.
func delivered() Sink {
	d := func(typ, key string, rev uint64) Delivery {
		return Delivery{ID: fmt.Sprintf("%s.%d.%s", key, rev, typ), Type: typ, Key: key, Revision: rev}
	}
	return Sink{Name: "hook", Selects: inNS, Deliveries: []Delivery{
		d(Added, "ns/a", 10), d(Added, "ns/b", 11), d(Modified, "ns/a", 12), d(Deleted, "ns/b", 14),
		d(Modified, "ns/a", 15), d(Modified, "ns/a", 12), d(Added, "ns/d", 16),
	}}
}

func TestASinkThatKeepsEveryPromisePassesEverySinkValidator(t *testing.T) {
	if v := append(Deliveries(history, delivered()), Delivered(history, delivered())...); len(v) > 0 {
		t.Errorf("%v; want none", v)
	}
	// A deletion a relist found carries the object as last seen: it converges all the same.
	relisted := editSink(delivered(), func(d []Delivery) []Delivery { d[3].Revision = 11; return d })
	if v := Deliveries(history, relisted); len(v) > 0 {
		t.Errorf("a deletion found by a relist: %v; want none", v)
	}
}

// TestAGapExcusesOnlyTheVersionsItReplaced: where the informer lost its watch and listed again
// (a Gap), a version that a later one replaced within the gap may be missing, and the deletion
// found by the list carries the version the informer last saw; a version replaced after the gap,
// or the last one, must still arrive.
func TestAGapExcusesOnlyTheVersionsItReplaced(t *testing.T) {
	lost := func(d []Delivery) []Delivery { // MODIFIED ns/a 12, and its repeat
		return slices.DeleteFunc(d, func(d Delivery) bool { return d.Key == "ns/a" && d.Revision == 12 })
	}
	gapped := editSink(delivered(), lost)
	gapped.Gaps = []Gap{{From: 11, To: 15}}
	if v := append(Deliveries(history, gapped), Delivered(history, gapped)...); len(v) > 0 {
		t.Errorf("12, replaced by 15 within the gap: %v; want none", v)
	}
	short := editSink(delivered(), lost)
	short.Gaps = []Gap{{From: 11, To: 14}}
	wantViolation(t, Delivered(history, short), "Delivered")
}

// TestADeletionAListFoundAfterAGapMayCarryAnEarlierLife: an object deleted, created again and
// deleted again within a gap is seen gone by the list, whose deletion carries the version the
// informer last saw, of its first life; outside a gap that is not the object's last state.
func TestADeletionAListFoundAfterAGapMayCarryAnEarlierLife(t *testing.T) {
	h := History{{Added, "ns/x", 1, false, ""}, {Deleted, "ns/x", 3, false, ""}, {Added, "ns/x", 5, false, ""}, {Deleted, "ns/x", 7, false, ""}}
	s := Sink{Name: "hook", Deliveries: []Delivery{{ID: "x.1", Type: Added, Key: "ns/x", Revision: 1}, {ID: "x.1.deleted", Type: Deleted, Key: "ns/x", Revision: 1}}, Gaps: []Gap{{From: 2, To: 8}}}
	if v := append(Deliveries(h, s), Delivered(h, s)...); len(v) > 0 {
		t.Errorf("%v; want none", v)
	}
	s.Gaps = nil
	wantViolation(t, Deliveries(h, s), "Converged")
}

// TestEachSinkValidatorFailsOnTheDeliveriesThatBreakItsPromise: every sink validator finds what
// it is for.
func TestEachSinkValidatorFailsOnTheDeliveriesThatBreakItsPromise(t *testing.T) {
	for _, tt := range []struct {
		name      string
		sink      Sink
		validator string
	}{
		{"a change in the middle never delivered", editSink(delivered(), func(d []Delivery) []Delivery { return slices.Delete(d, 1, 2) }), "Delivered"},
		{"a change in the middle only refused", editSink(delivered(), func(d []Delivery) []Delivery { d[1].Refused = true; return d }), "Delivered"},
		{"an object's last state only refused", editSink(delivered(), func(d []Delivery) []Delivery { d[6].Refused = true; return d }), "Converged"},
		{"an object's last version never delivered", editSink(delivered(), func(d []Delivery) []Delivery { return slices.Delete(d, 4, 5) }), "Converged"},
		{"a deletion never delivered", editSink(delivered(), func(d []Delivery) []Delivery { return slices.Delete(d, 3, 4) }), "Converged"},
		{"an older version first arriving after a newer", editSink(delivered(), func(d []Delivery) []Delivery { d[2], d[4] = d[4], d[2]; return d }), "InOrder"},
		{"a repeat under another id", editSink(delivered(), func(d []Delivery) []Delivery { d[5].ID = "other"; return d }), "StableIDs"},
		{"two changes under one id", editSink(delivered(), func(d []Delivery) []Delivery { d[6].ID = d[0].ID; return d }), "StableIDs"},
		{"a version the history never had", editSink(delivered(), func(d []Delivery) []Delivery {
			return append(d, Delivery{ID: "x", Type: Modified, Key: "ns/a", Revision: 13})
		}), "Known"},
		{"an object the sink does not select", editSink(delivered(), func(d []Delivery) []Delivery {
			return append(d, Delivery{ID: "y", Type: Added, Key: "other/c", Revision: 13})
		}), "Known"},
		{"a deletion at a version that was not the last", editSink(delivered(), func(d []Delivery) []Delivery { d[3].Revision = 10; return d }), "Known"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wantViolation(t, append(Deliveries(history, tt.sink), Delivered(history, tt.sink)...), tt.validator)
		})
	}
}

// editSink is s with its deliveries changed by f, on a copy.
func editSink(s Sink, f func([]Delivery) []Delivery) Sink {
	s.Deliveries = f(slices.Clone(s.Deliveries))
	return s
}

// TestEachDeliveryNamesItsClusterAndWhoMadeItsVersion: Attributed passes a sink whose
// deliveries name its cluster and the managers who made each version, and reports a delivery
// naming another cluster, a manager with no entry in the version, or, where dynwatch followed
// every change, other managers than who made it: but not within a gap.
func TestEachDeliveryNamesItsClusterAndWhoMadeItsVersion(t *testing.T) {
	attributed := func() Sink {
		s := delivered()
		s.Cluster, s.ExactManagers = "east", true
		s.Attribution = map[string]Attribution{
			Version("ns/a", 10): {Changed: "tool-a", Present: "tool-a"},
			Version("ns/b", 11): {Changed: "tool-a", Present: "tool-a"},
			Version("ns/a", 12): {Changed: "tool-b", Present: "tool-a,tool-b"},
			Version("ns/a", 15): {Changed: "tool-a", Present: "tool-a,tool-b"},
			Version("ns/d", 16): {Changed: "tool-a", Present: "tool-a"},
		}
		for i := range s.Deliveries {
			d := &s.Deliveries[i]
			d.Cluster = "east"
			if d.Type != Deleted {
				d.Managers, d.Named = s.Attribution[Version(d.Key, d.Revision)].Changed, true
			}
		}
		return s
	}
	if v := Attributed(history, attributed()); len(v) > 0 {
		t.Fatalf("%v; want none", v)
	}
	for name, c := range map[string]struct {
		edit func(*Sink)
		want int
	}{
		"another cluster":                     {func(s *Sink) { s.Deliveries[1].Cluster = "west" }, 1},
		"a manager with no entry":             {func(s *Sink) { s.Deliveries[0].Managers = "tool-z" }, 1},
		"who did not make it":                 {func(s *Sink) { s.Deliveries[2].Managers = "tool-a" }, 2}, // and its repeat
		"who did not make it, within a gap":   {func(s *Sink) { s.Deliveries[2].Managers = "tool-a"; s.Gaps = []Gap{{From: 11, To: 12}} }, 0},
		"who did not make it, inexact checks": {func(s *Sink) { s.Deliveries[2].Managers = "tool-a"; s.ExactManagers = false }, 0},
	} {
		t.Run(name, func(t *testing.T) {
			s := attributed()
			if name == "who did not make it" {
				s.Deliveries[5].Managers = "tool-a"
			}
			c.edit(&s)
			if v := Attributed(history, s); len(v) != c.want {
				t.Fatalf("%d violations %v; want %d", len(v), v, c.want)
			}
		})
	}
}
