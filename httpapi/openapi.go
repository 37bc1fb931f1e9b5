package httpapi

import (
	"context"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	openapi_v2 "github.com/google/gnostic-models/openapiv2"
	"golang.org/x/sync/singleflight"
	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// openAPITTL is how long a document cut from the apiserver's is served before it is read again.
const openAPITTL = time.Minute

// The media types of OpenAPI documents in protobuf, as clients ask for them, and the one the
// apiserver answers v2 with (Go's mime package, which clients parse it with, rejects '@').
const (
	openAPIV2Proto         = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
	openAPIV3Proto         = "application/com.github.proto-openapi.spec.v3@v1.0+protobuf"
	openAPIV2ProtoResponse = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
)

// openAPI serves the apiserver's OpenAPI v2 and v3 documents cut to what dynwatch serves: the
// GET operations of the watched resources' paths and the schemas they and the watched kinds
// reach, so that kubectl explain describes exactly the resources it can read here. Documents
// are read with dynwatch's identity and kept for openAPITTL per set of served resources.
type openAPI struct {
	client rest.Interface // nil: OpenAPI is not served
	flight singleflight.Group
	mu     sync.Mutex
	docs   map[string]openAPIDoc // by path
}

type openAPIDoc struct {
	served string // the served resources it was cut for
	at     time.Time
	json   []byte
	proto  []byte // v2 only
}

func newOpenAPI(client kubernetes.Interface) *openAPI {
	o := &openAPI{docs: map[string]openAPIDoc{}}
	if client != nil {
		o.client = client.Discovery().RESTClient()
	}
	return o
}

// servedSet describes what is served, to key cut documents on.
func servedSet(served map[schema.GroupVersion][]metav1.APIResource) string {
	var parts []string
	for gv, rs := range served {
		for _, r := range rs {
			parts = append(parts, gv.String()+"/"+r.Name+"="+r.Kind)
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// document returns the document at path, cut by cut from the apiserver's, from the cache when
// it is younger than openAPITTL and was cut for the same served resources.
func (o *openAPI) document(ctx context.Context, path, served string, cut func([]byte) (openAPIDoc, error)) (openAPIDoc, error) {
	o.mu.Lock()
	d, ok := o.docs[path]
	o.mu.Unlock()
	if ok && d.served == served && time.Since(d.at) < openAPITTL {
		return d, nil
	}
	v, err, _ := o.flight.Do(path+"\x00"+served, func() (any, error) {
		read, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		raw, err := o.client.Get().AbsPath(path).SetHeader("Accept", "application/json").Do(read).Raw()
		if err != nil {
			return openAPIDoc{}, err
		}
		d, err := cut(raw)
		if err != nil {
			return openAPIDoc{}, fmt.Errorf("cut %s: %w", path, err)
		}
		d.served, d.at = served, time.Now()
		o.mu.Lock()
		o.docs[path] = d
		o.mu.Unlock()
		return d, nil
	})
	if err != nil {
		return openAPIDoc{}, err
	}
	return v.(openAPIDoc), nil
}

// servedAPIPath reports whether rest, a document path after its group version prefix
// ("/api/v1/" or "/apis/{group}/{version}/"), addresses a served resource's list or object,
// namespaced or not; dynwatch serves no subresources and no /watch/ paths.
func servedAPIPath(rest string, resources map[string]bool) bool {
	segs := strings.Split(strings.Trim(rest, "/"), "/")
	if len(segs) >= 3 && segs[0] == "namespaces" && segs[1] == "{namespace}" {
		segs = segs[2:]
	}
	return resources[segs[0]] && (len(segs) == 1 || (len(segs) == 2 && segs[1] == "{name}"))
}

// gvPath is a group version's path under /openapi/v3 and its API prefix.
func gvPath(gv schema.GroupVersion) string {
	if gv.Group == "" {
		return "api/" + gv.Version
	}
	return "apis/" + gv.Group + "/" + gv.Version
}

// cutDocument keeps, in an OpenAPI document (v2 or v3), the GET operations of the paths that
// keepPath accepts and the schemas (under schemasAt, referenced as refPrefix+name) that they
// and the served kinds reach.
func cutDocument(doc map[string]any, keepPath func(string) bool, kinds map[schema.GroupVersionKind]bool, schemasAt []string, refPrefix string) {
	paths, _ := doc["paths"].(map[string]any)
	for p, item := range paths {
		ops, _ := item.(map[string]any)
		if !keepPath(p) || ops["get"] == nil {
			delete(paths, p)
			continue
		}
		for op := range ops {
			if op != "get" && op != "parameters" {
				delete(ops, op)
			}
		}
	}
	schemas := doc
	for _, k := range schemasAt {
		schemas, _ = schemas[k].(map[string]any)
	}
	var todo []string
	for name, s := range schemas {
		s, _ := s.(map[string]any)
		gvks, _ := s["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			g, _ := g.(map[string]any)
			gs, _ := g["group"].(string)
			vs, _ := g["version"].(string)
			ks, _ := g["kind"].(string)
			if kinds[schema.GroupVersionKind{Group: gs, Version: vs, Kind: ks}] {
				todo = append(todo, name)
			}
		}
	}
	todo = appendRefs(todo, paths, refPrefix)
	keep := map[string]bool{}
	for len(todo) > 0 {
		name := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if keep[name] || schemas[name] == nil {
			continue
		}
		keep[name] = true
		todo = appendRefs(todo, schemas[name], refPrefix)
	}
	for name := range schemas {
		if !keep[name] {
			delete(schemas, name)
		}
	}
}

// appendRefs appends the names of the schemas v refers to ({"$ref": refPrefix+name}).
func appendRefs(names []string, v any, refPrefix string) []string {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok && k == "$ref" && strings.HasPrefix(s, refPrefix) {
				names = append(names, strings.TrimPrefix(s, refPrefix))
				continue
			}
			names = appendRefs(names, e, refPrefix)
		}
	case []any:
		for _, e := range v {
			names = appendRefs(names, e, refPrefix)
		}
	}
	return names
}

// kindsOf are the served kinds, with the resources served per group version prefix.
func kindsOf(served map[schema.GroupVersion][]metav1.APIResource) (map[schema.GroupVersionKind]bool, map[string]map[string]bool) {
	kinds := map[schema.GroupVersionKind]bool{}
	resources := map[string]map[string]bool{}
	for gv, rs := range served {
		prefix := "/" + gvPath(gv) + "/"
		resources[prefix] = map[string]bool{}
		for _, r := range rs {
			kinds[gv.WithKind(r.Kind)] = true
			resources[prefix][r.Name] = true
		}
	}
	return kinds, resources
}

// keepServed accepts a document path that addresses a served resource.
func keepServed(resources map[string]map[string]bool) func(string) bool {
	return func(p string) bool {
		for prefix, rs := range resources {
			if rest, ok := strings.CutPrefix(p, prefix); ok {
				return servedAPIPath(rest, rs)
			}
		}
		return false
	}
}

// serveDocument answers with the document at path, cut by cut (see openAPI.document): in
// protobuf when the document has that form and the client asks for it, else JSON.
func (a *api) serveDocument(c *gin.Context, path, served string, cut func([]byte) (openAPIDoc, error)) {
	d, err := a.openAPI.document(c.Request.Context(), path, served, cut)
	if err != nil {
		a.Logger.Warn("cannot read OpenAPI from the apiserver", "path", path, "err", err)
		writeStatus(c.Writer, apierrors.NewServiceUnavailable("the OpenAPI document could not be read from the apiserver"))
		return
	}
	if d.proto != nil && accepts(c.Request, openAPIV2Proto) {
		c.Data(http.StatusOK, openAPIV2ProtoResponse, d.proto)
		return
	}
	c.Data(http.StatusOK, "application/json", d.json)
}

// cutJSON decodes an OpenAPI document, cuts it (cutDocument) and encodes it again.
func cutJSON(raw []byte, served map[schema.GroupVersion][]metav1.APIResource, schemasAt []string, refPrefix string) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	kinds, resources := kindsOf(served)
	cutDocument(doc, keepServed(resources), kinds, schemasAt, refPrefix)
	return json.Marshal(doc)
}

// openAPIServed reports whether OpenAPI can be served, answering 404 when it cannot.
func (a *api) openAPIServed(c *gin.Context) bool {
	c.Set(routeKey, "openapi")
	a.deadline(c, a.RequestTimeout)
	if a.openAPI.client == nil {
		writeStatus(c.Writer, notServed())
		return false
	}
	return true
}

// openAPIV2 answers /openapi/v2, in protobuf when the client asks for it (as client-go does).
func (a *api) openAPIV2(c *gin.Context) {
	if !a.openAPIServed(c) {
		return
	}
	served := a.served()
	a.serveDocument(c, "/openapi/v2", servedSet(served), func(raw []byte) (openAPIDoc, error) {
		j, err := cutJSON(raw, served, []string{"definitions"}, "#/definitions/")
		if err != nil {
			return openAPIDoc{}, err
		}
		parsed, err := openapi_v2.ParseDocument(j)
		if err != nil {
			return openAPIDoc{}, err
		}
		pb, err := proto.Marshal(parsed)
		return openAPIDoc{json: j, proto: pb}, err
	})
}

// openAPIV3 answers /openapi/v3 (the index of group versions) and /openapi/v3/{gv path} (one
// group version's document) for the served group versions. Documents are JSON only.
func (a *api) openAPIV3(c *gin.Context) {
	if !a.openAPIServed(c) {
		return
	}
	if accepts(c.Request, openAPIV3Proto) && !accepts(c.Request, "application/json") {
		writeStatus(c.Writer, apierrors.NewGenericServerResponse(http.StatusNotAcceptable, "get", schema.GroupResource{}, "", "only application/json is served", 0, false))
		return
	}
	served := a.served()
	set := servedSet(served)
	requested := strings.Trim(strings.TrimPrefix(c.Request.URL.Path, "/openapi/v3"), "/")
	if requested == "" {
		a.serveDocument(c, "/openapi/v3", set, func(raw []byte) (openAPIDoc, error) {
			j, err := v3Index(raw, served, set)
			return openAPIDoc{json: j}, err
		})
		return
	}
	for gv, resources := range served {
		if gvPath(gv) == requested {
			a.serveDocument(c, "/openapi/v3/"+requested, set, func(raw []byte) (openAPIDoc, error) {
				j, err := cutJSON(raw, map[schema.GroupVersion][]metav1.APIResource{gv: resources}, []string{"components", "schemas"}, "#/components/schemas/")
				return openAPIDoc{json: j}, err
			})
			return
		}
	}
	writeStatus(c.Writer, notServed())
}

// v3Index lists, of the apiserver's /openapi/v3 index, the served group versions, each with a
// URL whose hash changes when the apiserver's document or what dynwatch serves of it does.
func v3Index(raw []byte, served map[schema.GroupVersion][]metav1.APIResource, set string) ([]byte, error) {
	type entry struct {
		URL string `json:"serverRelativeURL"`
	}
	var index struct {
		Paths map[string]entry `json:"paths"`
	}
	if err := json.Unmarshal(raw, &index); err != nil {
		return nil, err
	}
	out := map[string]map[string]entry{"paths": {}}
	for gv := range served {
		p := gvPath(gv)
		if upstream, ok := index.Paths[p]; ok {
			sum := sha512.Sum512([]byte(upstream.URL + "\x00" + set))
			out["paths"][p] = entry{URL: "/openapi/v3/" + p + "?hash=" + strings.ToUpper(hex.EncodeToString(sum[:]))}
		}
	}
	return json.Marshal(out)
}

// accepts reports whether the Accept header names mediaType.
func accepts(r *http.Request, mediaType string) bool {
	for accept := range strings.SplitSeq(r.Header.Get("Accept"), ",") {
		if t, _, _ := strings.Cut(strings.TrimSpace(accept), ";"); t == mediaType {
			return true
		}
	}
	return false
}
