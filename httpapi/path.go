package httpapi

import (
	"net/url"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// target is what a Kubernetes API path addresses.
type target struct {
	// discovery is set for /api, /api/v1, /apis, /apis/{g} and /apis/{g}/{v}: "root" (/api
	// or /apis), "group" or "version".
	discovery string
	legacy    bool // under /api rather than /apis
	gv        schema.GroupVersion
	resource  string
	namespace string // set when the path has namespaces/{namespace}/{resource}
	name      string
	// subresource follows the name: revisions, the one dynwatch serves.
	subresource string
}

// parsePath splits a Kubernetes API path: /api/v1/..., /apis/{group}/{version}/..., followed
// by {resource}, {resource}/{name}, namespaces/{ns}/{resource} or namespaces/{ns}/{resource}/{name},
// each of the named ones followed or not by /{subresource}.
func parsePath(path string) (target, bool) {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	var t target
	switch segs[0] {
	case "api":
		t.legacy = true
		if len(segs) == 1 {
			t.discovery = "root"
			return t, true
		}
		t.gv = schema.GroupVersion{Version: segs[1]}
		segs = segs[2:]
	case "apis":
		switch len(segs) {
		case 1:
			t.discovery = "root"
			return t, true
		case 2:
			t.discovery, t.gv.Group = "group", segs[1]
			return t, true
		}
		t.gv = schema.GroupVersion{Group: segs[1], Version: segs[2]}
		segs = segs[3:]
	default:
		return t, false
	}
	switch {
	case len(segs) == 0:
		t.discovery = "version"
	case len(segs) >= 3 && segs[0] == "namespaces":
		t.namespace, t.resource = segs[1], segs[2]
		if len(segs) >= 4 {
			t.name = segs[3]
		}
		if len(segs) == 5 {
			t.subresource = segs[4]
		}
		return t, len(segs) <= 5 && t.namespace != "" && t.resource != "" && (len(segs) == 3 || t.name != "") && (len(segs) < 5 || t.subresource != "")
	case len(segs) <= 3:
		t.resource = segs[0]
		if len(segs) >= 2 {
			t.name = segs[1]
		}
		if len(segs) == 3 {
			t.subresource = segs[2]
		}
		return t, t.resource != "" && (len(segs) == 1 || t.name != "") && (len(segs) < 3 || t.subresource != "")
	default:
		return t, false
	}
	return t, true
}

// watch reports whether a GET of t with query v is a watch, as the apiserver decides it: a
// collection with the watch flag is watched; a path that names an object is a get, which
// answers the object whatever its watch parameter (the apiserver authorizes it as get, and
// its get handler ignores watch). A named watch is a collection's, with the field selector
// metadata.name.
func (t target) watch(v url.Values) bool { return t.name == "" && boolParameter(v, "watch") }
