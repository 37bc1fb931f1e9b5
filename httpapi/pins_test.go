package httpapi

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/dynamicinformer"
)

// TestAPagedListsSnapshotIsKeptForItsPagesOnly: a list's later pages find its snapshot, for its
// resource only, until it expires or more recent lists crowd it out.
func TestAPagedListsSnapshotIsKeptForItsPagesOnly(t *testing.T) {
	now := time.Unix(1000, 0)
	p := newPins(func() time.Time { return now })
	cms, secrets := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	id := p.pin(cms, dynamicinformer.NewSnapshot(cm("a", 1)))
	if snap, ok := p.get(id, cms); !ok || snap.Len() != 1 {
		t.Fatalf("the pinned snapshot: found %t, %d objects; want it, with 1", ok, snap.Len())
	}
	if _, ok := p.get(id, secrets); ok {
		t.Errorf("a configmaps snapshot was found for secrets")
	}
	now = now.Add(pinTTL)
	if _, ok := p.get(id, cms); ok {
		t.Errorf("a snapshot was found after %s", pinTTL)
	}
	first := p.pin(cms, dynamicinformer.Snapshot{})
	for range maxPins {
		p.pin(cms, dynamicinformer.Snapshot{})
	}
	if _, ok := p.get(first, cms); ok {
		t.Errorf("the oldest of %d snapshots was kept", maxPins+1)
	}
	if _, ok := p.get(first+1, cms); !ok {
		t.Errorf("the second oldest of %d snapshots was dropped", maxPins+1)
	}
}
