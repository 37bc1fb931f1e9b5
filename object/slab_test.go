package object

import (
	"fmt"
	"strings"
	"testing"
)

// TestASlabsObjectsReadAsOfJSONsAndItsSecondUseAllocatesNothing makes more objects than a chunk
// holds, with headers of every kind (a label value kept in the header, for the JSON escapes it,
// and a header past a quarter of a chunk), twice with a Reset between: each reads as OfJSON's,
// once all are made. A slab used again for objects whose JSON escapes nothing, and whose
// headers fit its chunks, allocates nothing.
func TestASlabsObjectsReadAsOfJSONsAndItsSecondUseAllocatesNothing(t *testing.T) {
	doc := func(i int) []byte {
		labels := fmt.Sprintf(`"app":"a%d","tier":"t%d"`, i, i)
		if i%5 == 0 {
			labels += `,"escaped":"\u0041"` // read unescaped: kept in the header
		}
		if i%97 == 0 {
			labels += fmt.Sprintf(`,"big":"%s"`, strings.Repeat(`\u0042`, 9000)) // past a quarter of a chunk
		}
		return fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"namespace":"ns%d","name":"cm%d","uid":"u%d","resourceVersion":"%d","labels":{%s}},"data":{"k":"v"}}`, i%3, i, i, 100+i, labels)
	}
	const n = 3*slabObjects + 17
	docs := make([][]byte, n)
	for i := range docs {
		docs[i] = doc(i)
	}
	var s Slab
	check := func(use int) {
		got := make([]*Object, n)
		for i, b := range docs {
			got[i] = s.OfJSON(b)
		}
		for i, o := range got { // after all were made: none wrote over another
			want := OfJSON(docs[i], nil, nil)
			if o.GetNamespace() != want.GetNamespace() || o.GetName() != want.GetName() || o.GetUID() != want.GetUID() ||
				o.GetResourceVersion() != want.GetResourceVersion() || o.Labels().Get("tier") != want.Labels().Get("tier") ||
				o.Labels().Get("big") != want.Labels().Get("big") || o.Labels().Get("escaped") != want.Labels().Get("escaped") || string(o.JSON()) != string(want.JSON()) {
				t.Fatalf("use %d, object %d: %s %s %s %q; want %s %s %s %q", use, i, o.GetNamespace(), o.GetName(), o.GetResourceVersion(),
					o.Labels().Get("tier"), want.GetNamespace(), want.GetName(), want.GetResourceVersion(), want.Labels().Get("tier"))
			}
		}
		s.Reset()
	}
	check(1)
	check(2)
	var small [][]byte // nothing escaped, no header past a quarter of a chunk
	for i, b := range docs[:slabObjects+10] {
		if i%5 != 0 && i%97 != 0 {
			small = append(small, b)
		}
	}
	allocs := testing.AllocsPerRun(10, func() {
		for _, b := range small {
			s.OfJSON(b)
		}
		s.Reset()
	})
	if allocs != 0 {
		t.Fatalf("a slab used again allocated %.0f times for %d objects; want none", allocs, len(small))
	}
}
