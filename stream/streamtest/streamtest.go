// Package streamtest holds what the stream transports' tests share: deliveries made as the
// delivery core hands them to a transport. Only tests import it.
package streamtest

import (
	"context"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

// ConfigMapAt is a MODIFIED of configmap ns/name at resourceVersion rv, with its event id and
// ordering key.
func ConfigMapAt(ns, name, rv string) *delivery.Delivery {
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name, "namespace": ns, "uid": "u-" + name, "resourceVersion": rv}}}
	e := object.Event{Type: object.Modified, Resource: gvr, Object: object.New(u), Observed: time.Now()}
	return &delivery.Delivery{Entry: journal.Entry{Event: e, ID: journal.EventID(e), Key: object.OrderingKey(gvr, ns, name)}}
}

// Fence is a leader election fence whose lapse the test decides.
type Fence struct{ Lapse atomic.Bool }

// Bound implements delivery.Fence: ctx as it is, held unless the test made it lapse.
func (f *Fence) Bound(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	return ctx, func() {}, !f.Lapse.Load()
}

// Lapsed implements delivery.Fence.
func (f *Fence) Lapsed() bool { return f.Lapse.Load() }

// Wait implements delivery.Fence: it returns when ctx ends.
func (f *Fence) Wait(ctx context.Context) { <-ctx.Done() }
