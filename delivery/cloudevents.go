package delivery

import (
	"fmt"
	"strings"
	"time"

	"github.com/dynwatch/dynwatch/object"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// This file makes a delivery's CloudEvents attributes, the same for every transport.

// Attribute is a CloudEvents context attribute as a binary-mode header carries it.
type Attribute struct{ Name, Value string }

// MaxAttributes is the most attributes AppendCloudEvent appends.
const MaxAttributes = 10

// AppendCloudEvent appends to dst d's CloudEvents attributes, from cluster c (at most
// MaxAttributes); the HTTP and NATS bindings carry their values through HeaderString, the
// Kafka binding as they are. The subject is the object's key; the extension attributes
// cluster and clustername name c, and fieldmanager the field manager that changed the object
// (object.PrimaryManager), when one is known. A caller that sends many appends to an array
// of its own (a webhook's every request made one).
func AppendCloudEvent(dst []Attribute, d *Delivery, c object.Cluster) []Attribute {
	e := &d.Event
	out := append(dst,
		Attribute{"specversion", "1.0"},
		Attribute{"id", d.ID},
		Attribute{"source", resourcePath(e.Resource)},
		Attribute{"type", "io.dynwatch.resource." + e.Type.Lower()},
		Attribute{"subject", object.KeyOf(e.Object)},
		Attribute{"time", e.Observed.UTC().Format(time.RFC3339Nano)},
	)
	if m := object.PrimaryManager(e.Managers); m != "" {
		out = append(out, Attribute{"fieldmanager", m})
	}
	if c.ID != "" {
		out = append(out, Attribute{"cluster", c.ID})
	}
	if c.Name != "" {
		out = append(out, Attribute{"clustername", c.Name})
	}
	if d.FilterError != "" {
		// An extension attribute: the filter could not decide, and filterErrors is deliver.
		out = append(out, Attribute{"filtererror", d.FilterError})
	}
	return out
}

// HeaderString is a CloudEvents string attribute as the HTTP and NATS bindings carry it in a
// header: space, '"', '%' and anything outside printable ASCII percent-encoded (UTF-8 bytes).
func HeaderString(v string) string {
	if !strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r >= 0x7f || r == '"' || r == '%' }) {
		return v
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// resourcePath is the resource's collection path in the Kubernetes API, used as ce-source.
func resourcePath(gvr schema.GroupVersionResource) string {
	if gvr.Group == "" {
		return "/api/" + gvr.Version + "/" + gvr.Resource
	}
	return "/apis/" + gvr.Group + "/" + gvr.Version + "/" + gvr.Resource
}
