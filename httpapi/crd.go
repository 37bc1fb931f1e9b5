package httpapi

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/jsonpath"

	"github.com/dynwatch/dynwatch/config"
)

// crdTTL is how long what a CustomResourceDefinition says is reused before it is read again.
const crdTTL = 30 * time.Second

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// crdView is what a CustomResourceDefinition says of one served version that discovery does
// not: its printer columns and its selectable fields (as dot paths).
type crdView struct {
	columns    []crdColumn
	selectable []string
}

type crdColumn struct {
	def      metav1.TableColumnDefinition
	jsonPath string
}

// crds reads CustomResourceDefinitions from the apiserver, with dynwatch's identity, for
// resources of named groups, and keeps each answer for crdTTL: a missing or unreadable CRD is
// a resource without extra columns or fields, not a failed request. Safe for concurrent use.
type crds struct {
	client dynamic.Interface // nil: no CRD is read
	log    *slog.Logger
	flight singleflight.Group
	mu     sync.Mutex
	seen   map[schema.GroupVersionResource]crdSeen
}

type crdSeen struct {
	view crdView
	at   time.Time
}

func newCRDs(client dynamic.Interface, log *slog.Logger) *crds {
	return &crds{client: client, log: log, seen: map[schema.GroupVersionResource]crdSeen{}}
}

// view returns what gvr's CRD says, reading it when the last answer is older than crdTTL.
// Built-in groups (the core group and groups without a dot) are never read.
func (c *crds) view(ctx context.Context, gvr schema.GroupVersionResource) crdView {
	if c.client == nil || !strings.Contains(gvr.Group, ".") {
		return crdView{}
	}
	c.mu.Lock()
	s, ok := c.seen[gvr]
	c.mu.Unlock()
	if ok && time.Since(s.at) < crdTTL {
		return s.view
	}
	v, _, _ := c.flight.Do(gvr.String(), func() (any, error) {
		read, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		view := c.read(read, gvr)
		c.mu.Lock()
		c.seen[gvr] = crdSeen{view: view, at: time.Now()}
		c.mu.Unlock()
		return view, nil
	})
	return v.(crdView)
}

func (c *crds) read(ctx context.Context, gvr schema.GroupVersionResource) crdView {
	name := gvr.Resource + "." + gvr.Group
	obj, err := c.client.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return crdView{} // a built-in or aggregated API
	case err != nil:
		c.log.Warn("cannot read the CustomResourceDefinition: tables show Name and Age, field selectors only metadata fields", "crd", name, "err", err)
		return crdView{}
	}
	view, err := parseCRD(obj, gvr.Version)
	if err != nil {
		c.log.Warn("CustomResourceDefinition not understood", "crd", name, "err", err)
	}
	return view
}

// parseCRD reads version's printer columns and selectable fields from a CRD.
func parseCRD(crd *unstructured.Unstructured, version string) (crdView, error) {
	versions, _, err := unstructured.NestedSlice(crd.Object, "spec", "versions")
	if err != nil {
		return crdView{}, err
	}
	var view crdView
	for _, v := range versions {
		v, _ := v.(map[string]any)
		if v["name"] != version {
			continue
		}
		columns, _, _ := unstructured.NestedSlice(v, "additionalPrinterColumns")
		for i, col := range columns {
			col, _ := col.(map[string]any)
			name, _ := col["name"].(string)
			typ, _ := col["type"].(string)
			format, _ := col["format"].(string)
			path, _ := col["jsonPath"].(string)
			desc, _ := col["description"].(string)
			priority, _, _ := unstructured.NestedInt64(col, "priority")
			if name == "" || path == "" {
				return view, fmt.Errorf("additionalPrinterColumns[%d] has no name or jsonPath", i)
			}
			if desc == "" {
				desc = "Custom resource definition column (in JSONPath format): " + path
			}
			view.columns = append(view.columns, crdColumn{
				def:      metav1.TableColumnDefinition{Name: name, Type: typ, Format: format, Description: desc, Priority: int32(priority)},
				jsonPath: path,
			})
		}
		fields, _, _ := unstructured.NestedSlice(v, "selectableFields")
		for _, f := range fields {
			f, _ := f.(map[string]any)
			path, _ := f["jsonPath"].(string)
			if p, ok := config.DotPath(path); ok {
				view.selectable = append(view.selectable, p)
			}
		}
	}
	return view, nil
}

// printer shows a custom resource as the apiserver does: Name, then each printer column
// (the CRD's defaulting gives every CRD an Age column when it declares none).
func (v crdView) printer() (printer, bool) {
	if len(v.columns) == 0 {
		return printer{}, false
	}
	p := printer{columns: []metav1.TableColumnDefinition{nameColumn}}
	paths := make([]*jsonpath.JSONPath, len(v.columns))
	for i, col := range v.columns {
		jp := jsonpath.New(col.def.Name).AllowMissingKeys(true)
		if err := jp.Parse("{" + col.jsonPath + "}"); err != nil {
			return printer{}, false
		}
		paths[i] = jp
		p.columns = append(p.columns, col.def)
	}
	p.row = func(obj *unstructured.Unstructured) ([]any, []metav1.TableRowCondition) {
		cells := []any{obj.GetName()}
		var buf bytes.Buffer
		for i, jp := range paths {
			results, err := jp.FindResults(obj.Object)
			if err != nil || len(results) == 0 || len(results[0]) == 0 {
				cells = append(cells, nil)
				continue
			}
			value := results[0][0].Interface()
			if v.columns[i].def.Type != "string" {
				cells = append(cells, jsonCell(v.columns[i].def.Type, value))
				continue
			}
			buf.Reset()
			if err := jp.PrintResults(&buf, []reflect.Value{reflect.ValueOf(value)}); err != nil {
				cells = append(cells, nil)
				continue
			}
			cells = append(cells, buf.String())
		}
		return cells, nil
	}
	return p, true
}

// jsonCell is a printer column's cell for a value of the column's type, nil when the value is
// of another type (as the apiserver's CRD table convertor does).
func jsonCell(typ string, value any) any {
	switch typ {
	case "integer":
		switch v := value.(type) {
		case int64:
			return v
		case float64:
			return int64(v)
		}
	case "number":
		switch v := value.(type) {
		case int64:
			return float64(v)
		case float64:
			return v
		}
	case "boolean":
		if b, ok := value.(bool); ok {
			return b
		}
	case "date":
		if s, ok := value.(string); ok {
			var t metav1.Time
			if err := t.UnmarshalQueryParameter(s); err != nil {
				return "<invalid>"
			}
			return age(t)
		}
	}
	return nil
}
