package object

import "testing"

// TestTheZeroObjectReadsAsEmpty: an object.Object with no header has no name, labels or values, and
// does not panic.
func TestTheZeroObjectReadsAsEmpty(t *testing.T) {
	var o Object
	if o.GetName() != "" || o.GetNamespace() != "" || o.Labels().Has("app") || o.IndexValueCount(0) != 0 || len(o.GetObjectMeta().GetLabels()) != 0 {
		t.Errorf("the zero object.Object reads as %+v", o.GetObjectMeta())
	}
}
