package dynamicinformer

import (
	"strings"
	"testing"
)

// TestCuttingAnObjectAllocatesOnlyWhatItKeeps: the managedFields and the last-applied
// annotation are cut from an object's JSON on every event of its watch; the pieces of what is
// kept are listed on the stack, and the one allocation is the object's new bytes.
func TestCuttingAnObjectAllocatesOnlyWhatItKeeps(t *testing.T) {
	doc := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns",` +
		`"annotations":{"team":"blue","` + LastAppliedAnnotation + `":"{}"},` +
		`"managedFields":[{"manager":"kubectl","operation":"Apply"}]},"data":{"k":"v"}}`)
	want := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns",` +
		`"annotations":{"team":"blue"}},"data":{"k":"v"}}`
	c := cuts{managedFields: true, lastApplied: true}
	if got := string(c.apply(doc, "")); got != want {
		t.Fatalf("cut to\n%s\nwant\n%s", got, want)
	}
	if n := testing.AllocsPerRun(100, func() { c.apply(doc, "") }); n != 1 {
		t.Errorf("cutting an object allocated %v times; want once, its new bytes", n)
	}
	if strings.Contains(want, "managedFields") {
		t.Fatal("the expected object keeps managedFields")
	}
}
