package validate

import (
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

func TestASelectorSelectsByNamespaceNameAndLabels(t *testing.T) {
	for _, tt := range []struct {
		sel  Selector
		e    Event
		want bool
	}{
		{Selector{}, Event{Key: "ns/a"}, true},
		{Selector{}, Event{Key: "node-1"}, true},
		{Selector{Namespace: "ns"}, Event{Key: "ns/a"}, true},
		{Selector{Namespace: "ns"}, Event{Key: "other/a"}, false},
		{Selector{Namespace: "ns"}, Event{Key: "node-1"}, false},
		{Selector{Name: "a"}, Event{Key: "ns/a"}, true},
		{Selector{Name: "a"}, Event{Key: "ns/b"}, false},
		{Selector{Labels: "team=a"}, Event{Key: "ns/a", Labels: "team=a,tier=x"}, true},
		{Selector{Labels: "team=a"}, Event{Key: "ns/a", Labels: "team=b"}, false},
		{Selector{Labels: "team!=z"}, Event{Key: "ns/a"}, true},
		{Selector{Labels: "team in (a"}, Event{Key: "ns/a", Labels: "team=a"}, false}, // does not parse
		{Selector{Namespace: "ns", Except: []string{"ns/b"}}, Event{Key: "ns/a"}, true},
		{Selector{Namespace: "ns", Except: []string{"ns/b"}}, Event{Key: "ns/b"}, false},
	} {
		if got := tt.sel.Matches(tt.e); got != tt.want {
			t.Errorf("%+v matches %s: %v, want %v", tt.sel, tt.e, got, tt.want)
		}
	}
}

// TestARecordReadBackHoldsTheSameViolations: a record written to a file and read back is the
// same record, its selections included, so validating it again finds what the run found.
func TestARecordReadBackHoldsTheSameViolations(t *testing.T) {
	broken := edit(resumed(), func(e []Event) []Event { return slices.Delete(e, 2, 3) }) // DELETED ns/b lost
	r := Record{Seed: 7, Fault: "none", History: history, Streams: []Stream{resumed(), broken},
		Lists: []List{pagedAt13()}, Sinks: []Sink{delivered()}}
	r.Sinks[0].Selects.Except = []string{"ns/z"}
	path := filepath.Join(t.TempDir(), "record.json")
	if err := r.Write(path); err != nil {
		t.Fatal(err)
	}
	back, err := ReadRecord(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, r) {
		t.Fatalf("read back:\n%+v\nwritten:\n%+v", back, r)
	}
	want := r.Violations()
	wantViolation(t, want, "Reliable")
	if got := back.Violations(); !reflect.DeepEqual(got, want) {
		t.Errorf("violations read back: %v; written: %v", got, want)
	}
}
