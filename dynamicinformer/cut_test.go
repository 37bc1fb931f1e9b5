package dynamicinformer

import (
	"strings"
	"testing"

	"github.com/dynwatch/dynwatch/object"
)

// TestCuttingAnObjectAllocatesOnlyWhatItKeeps: the managedFields and the last-applied
// annotation are cut from an object's JSON on every event of its watch; the pieces of what is
// kept are listed on the stack, and the two allocations are the object's new bytes and the
// summary of its managedFields' managers.
func TestCuttingAnObjectAllocatesOnlyWhatItKeeps(t *testing.T) {
	doc := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns",` +
		`"annotations":{"team":"blue","` + LastAppliedAnnotation + `":"{}"},` +
		`"managedFields":[{"manager":"kubectl","operation":"Apply"}]},"data":{"k":"v"}}`)
	want := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns",` +
		`"annotations":{"team":"blue"}},"data":{"k":"v"}}`
	c := cuts{managedFields: true, lastApplied: true}
	got, managers := c.apply(doc, "")
	if string(got) != want {
		t.Fatalf("cut to\n%s\nwant\n%s", got, want)
	}
	if changed := object.ChangedManagers(nil, object.OfJSON(got, nil, managers)); string(changed) != `[{"manager":"kubectl","operation":"Apply","time":"","fields":[]}]` {
		t.Errorf("the cut object's managers are %s", changed)
	}
	if n := testing.AllocsPerRun(100, func() { c.apply(doc, "") }); n != 2 {
		t.Errorf("cutting an object allocated %v times; want twice, its new bytes and its managers' summary", n)
	}
	if strings.Contains(want, "managedFields") {
		t.Fatal("the expected object keeps managedFields")
	}
}
