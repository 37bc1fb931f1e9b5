package journal

import (
	"strings"
	"testing"
	"time"
)

func TestAnEntryReadsBackItsEventFromItsBody(t *testing.T) {
	for _, c := range []struct {
		name, body                  string
		typ, resource, ns, obj, uid string
		rv                          string
	}{
		{"a namespaced object, metadata after kind",
			`{"type":"MODIFIED","resource":{"group":"apps","version":"v1","resource":"deployments"},"object":{"kind":"Deployment","apiVersion":"apps/v1","metadata":{"name":"web","namespace":"team-a","uid":"u1","resourceVersion":"42","labels":{"name":"not-this"}},"spec":{"name":"nor-this"}},"oldObject":{"metadata":{"name":"old"}}}`,
			"MODIFIED", "deployments", "team-a", "web", "u1", "42"},
		{"a cluster-scoped object",
			`{"type":"ADDED","resource":{"group":"","version":"v1","resource":"namespaces"},"object":{"metadata":{"name":"team-a","uid":"u2","resourceVersion":"7"}}}`,
			"ADDED", "namespaces", "", "team-a", "u2", "7"},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := Entry{ID: "id", Key: "k", Body: []byte(c.body), Revision: 42, Enqueued: time.Unix(1, 0), FilterError: strings.Repeat("e", 200)}
			enc := appendEntry(nil, in)
			if len(enc) != encodedSize(in) {
				t.Errorf("encoded in %d bytes; encodedSize says %d", len(enc), encodedSize(in))
			}
			out, err := decodeEntry(enc)
			if err != nil {
				t.Fatal(err)
			}
			e := out.Event
			if string(e.Type) != c.typ || e.Resource.Resource != c.resource || e.Object.GetNamespace() != c.ns || e.Object.GetName() != c.obj ||
				string(e.Object.GetUID()) != c.uid || e.Object.GetResourceVersion() != c.rv || string(out.Body) != c.body || out.Revision != 42 {
				t.Fatalf("read back %s %s %s/%s uid %s at %s, revision %d; want %s %s %s/%s uid %s at %s, revision 42",
					e.Type, e.Resource.Resource, e.Object.GetNamespace(), e.Object.GetName(), e.Object.GetUID(), e.Object.GetResourceVersion(), out.Revision,
					c.typ, c.resource, c.ns, c.obj, c.uid, c.rv)
			}
		})
	}
	if _, err := decodeEntry(appendEntry(nil, Entry{ID: "id", Key: "k", Body: []byte(`{"resource":{}}`)})); err == nil {
		t.Error("a body without a type or an object decoded")
	}
}
