package httpapi

import (
	"context"
	"strconv"

	"github.com/dynwatch/dynwatch/object"
	"github.com/gin-gonic/gin"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var eventsGVR = schema.GroupVersionResource{Version: "v1", Resource: "events"}

// eventsFromAPIServer answers a list of core v1 events, which kubectl describe makes for the
// object it describes, when events are not a watched resource: from the apiserver with
// dynwatch's identity (the gate has authorized the caller to list them, as the apiserver
// would), or empty with api.events none. When the apiserver refuses or fails, the list is
// empty with a warning, so that describe still shows the object. It reports false for any
// other request.
func (a *api) eventsFromAPIServer(c *gin.Context, t target) bool {
	if t.gv.WithResource(t.resource) != eventsGVR || t.name != "" || c.GetString(routeKey) != "list" {
		return false
	}
	a.deadline(c, a.RequestTimeout)
	out := responder{gvk: eventsGVR.GroupVersion().WithKind("Event"), table: wantsTable(c.Request), include: includeObject(c.Request), printer: builtinPrinters[schema.GroupKind{Kind: "Event"}], chunks: a.chunks}
	list := &corev1.EventList{}
	if a.Kubernetes != nil && a.EventsFromAPIServer {
		v := c.Request.URL.Query()
		opts := metav1.ListOptions{LabelSelector: v.Get("labelSelector"), FieldSelector: v.Get("fieldSelector"), Continue: v.Get("continue"), Limit: int64(a.MaxPageSize)}
		if n, err := strconv.ParseInt(v.Get("limit"), 10, 64); err == nil && n > 0 && n < opts.Limit {
			opts.Limit = n
		}
		ctx, cancel := context.WithTimeout(c.Request.Context(), a.RequestTimeout)
		defer cancel()
		got, err := a.Kubernetes.CoreV1().Events(t.namespace).List(ctx, opts)
		if err != nil {
			a.Logger.Warn("cannot list events from the apiserver: answering an empty list", "namespace", t.namespace, "err", err)
			c.Header("Warning", `299 - "dynwatch: events could not be read from the apiserver; the list is empty"`)
		} else {
			list = got
		}
	}
	items := make([]*object.Object, 0, len(list.Items))
	for i := range list.Items {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&list.Items[i])
		if err != nil {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		u.SetGroupVersionKind(out.gvk) // a typed list's items carry no apiVersion and kind
		items = append(items, object.New(u))
	}
	p := page{items: items, next: list.Continue, remaining: list.RemainingItemCount}
	out.list(c.Writer, p, list.ResourceVersion)
	return true
}
