package httpapi

import (
	"encoding/json"
	"mime"
	"net/http"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/object"
	"github.com/tidwall/gjson"
)

// responder writes objects as the client asked: plain JSON, or a meta.k8s.io/v1 Table (what
// kubectl's human-readable output asks for) with the kind's printer's columns.
type responder struct {
	gvk     schema.GroupVersionKind
	table   bool
	include metav1.IncludeObjectPolicy
	printer printer
	chunks  chunks
}

// listChunk is the size past which a list's buffer is written out: a large list is never held
// in memory whole.
const listChunk = 64 << 10

// chunks are the buffers lists are written through, kept to be used again by the next list: a
// page of 100 made 72 KB of garbage otherwise, and at 20,000 configmaps a collection every 200
// requests whose mark assists the request that started it paid for in milliseconds. (Not a
// sync.Pool: it lets its buffers go at every collection, and under the race detector at random.)
type chunks chan *[]byte

// newChunks keeps up to n buffers: as many lists as are written at once use them again.
func newChunks(n int) chunks { return make(chunks, n) }

func (c chunks) get() *[]byte {
	select {
	case b := <-c:
		return b
	default:
		b := make([]byte, 0, listChunk+8<<10)
		return &b
	}
}

func (c chunks) put(b *[]byte) {
	if cap(*b) > 2*listChunk {
		return // grown for one large object: not kept
	}
	*b = (*b)[:0]
	select {
	case c <- b:
	default:
	}
}

// wantsTable reports whether the Accept header asks for a Table (as=Table;g=meta.k8s.io).
func wantsTable(r *http.Request) bool {
	for accept := range strings.SplitSeq(r.Header.Get("Accept"), ",") {
		_, params, err := mime.ParseMediaType(strings.TrimSpace(accept))
		if err == nil && params["as"] == "Table" && params["g"] == "meta.k8s.io" {
			return true
		}
	}
	return false
}

func includeObject(r *http.Request) metav1.IncludeObjectPolicy {
	switch p := metav1.IncludeObjectPolicy(r.URL.Query().Get("includeObject")); p {
	case metav1.IncludeNone, metav1.IncludeObject:
		return p
	default:
		return metav1.IncludeMetadata
	}
}

func (o responder) row(obj *object.Object) metav1.TableRow {
	var row metav1.TableRow
	row.Cells, row.Conditions = o.printer.cells(obj)
	switch o.include {
	case metav1.IncludeObject:
		row.Object.Raw = obj.JSON()
	case metav1.IncludeMetadata:
		raw := append([]byte(`{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":`), metadataJSON(obj)...)
		row.Object.Raw = append(raw, '}')
	}
	return row
}

// metadataJSON is obj's metadata as it is in its JSON, read without decoding it.
func metadataJSON(obj *object.Object) []byte {
	if m := gjson.GetBytes(obj.JSON(), "metadata"); m.IsObject() {
		return []byte(m.Raw)
	}
	return []byte("{}")
}

func (o responder) tableOf(objs []*object.Object, meta metav1.ListMeta, headers bool) *metav1.Table {
	t := &metav1.Table{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "Table"}, ListMeta: meta, Rows: []metav1.TableRow{}}
	if headers {
		t.ColumnDefinitions = o.printer.columns
	}
	for _, obj := range objs {
		t.Rows = append(t.Rows, o.row(obj))
	}
	return t
}

// object writes one object.
func (o responder) object(w http.ResponseWriter, obj *object.Object) {
	if o.table {
		writeJSON(w, http.StatusOK, o.tableOf([]*object.Object{obj}, metav1.ListMeta{ResourceVersion: obj.GetResourceVersion()}, true))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(obj.JSON())
	_, _ = w.Write([]byte{'\n'})
}

// list writes a {Kind}List (or a Table) for a page.
func (o responder) list(w http.ResponseWriter, p page, rv string) {
	meta := metav1.ListMeta{ResourceVersion: rv, Continue: p.next}
	if p.next != "" {
		meta.RemainingItemCount = p.remaining
	}
	if o.table {
		writeJSON(w, http.StatusOK, o.tableOf(p.items, meta, true))
		return
	}
	metaJSON, _ := json.Marshal(&meta)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	chunk := o.chunks.get()
	buf := *chunk
	defer func() { *chunk = buf; o.chunks.put(chunk) }() // grown, perhaps
	buf = append(buf, `{"apiVersion":`...)
	buf = object.AppendString(buf, o.gvk.GroupVersion().String())
	buf = append(buf, `,"kind":`...)
	buf = object.AppendString(buf, o.gvk.Kind+"List")
	buf = append(buf, `,"metadata":`...)
	buf = append(buf, metaJSON...)
	buf = append(buf, `,"items":[`...)
	for i, obj := range p.items {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, obj.JSON()...)
		if len(buf) >= listChunk {
			if _, err := w.Write(buf); err != nil {
				return
			}
			buf = buf[:0]
		}
	}
	buf = append(buf, "]}\n"...)
	_, _ = w.Write(buf)
}

// event returns one line of a watch stream, {"type":...,"object":...}; the object is a Table
// with one row when the client asked for tables, with column definitions on the first event
// only, as the apiserver does.
func (o responder) event(typ string, obj *object.Object, first bool) []byte {
	line := append([]byte(`{"type":`), object.AppendString(nil, typ)...)
	line = append(line, `,"object":`...)
	if o.table && typ != "BOOKMARK" {
		t, _ := json.Marshal(o.tableOf([]*object.Object{obj}, metav1.ListMeta{ResourceVersion: obj.GetResourceVersion()}, first))
		line = append(line, t...)
	} else {
		line = append(line, obj.JSON()...)
	}
	return append(line, "}\n"...)
}
