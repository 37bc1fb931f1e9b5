package dynamicinformer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/dynwatch/dynwatch/object"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
)

// TestAnObjectCutAsJSONIsKeptAsTheDecodedObjectWouldBe: an object that comes in as JSON (a wire
// object) is kept as the same object.Object, header, labels, indexer values and JSON (as a value), as the
// same object decoded into maps and stripped there, for every transform input of the golden
// tests and a few shapes of their own, under each setting of the transforms the JSON can be cut
// to, and under configurations that need the object decoded.
func TestAnObjectCutAsJSONIsKeptAsTheDecodedObjectWouldBe(t *testing.T) {
	inputs := map[string][]byte{
		"only last-applied":        []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"n","annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{}"},"managedFields":[{"manager":"m"}]},"data":{"k":"v"}}`),
		"last-applied first":       []byte(`{"metadata":{"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"a\":1}","example.com/team":"t"},"name":"a"},"kind":"ConfigMap","apiVersion":"v1"}`),
		"list item, no kind":       []byte(`{"metadata":{"managedFields":[],"name":"b","namespace":"n","uid":"u","resourceVersion":"7","labels":{"z":"1","app":"a\"b","e":"\u00e9"}},"data":{"x":"{\"}"}}`),
		"spaces":                   []byte("{ \"apiVersion\" : \"v1\" ,\n \"kind\":\"ConfigMap\", \"metadata\" : { \"name\" : \"c\" , \"managedFields\" : [ {} ] , \"ownerReferences\":[{\"kind\":\"Deployment\",\"name\":\"d\",\"uid\":\"ou\"},{\"kind\":\"Job\",\"name\":\"j\",\"uid\":\"ju\"}] } }"),
		"managedFields alone":      []byte(`{"metadata":{"managedFields":[{"manager":"m"}]}}`),
		"escaped keys, odd values": []byte(`{"kind":"X","apiVersion":"v1","metadata":{"name":"e","generation":3,"deletionGracePeriodSeconds":null,"manage\u0064Fields":[{"a":["]}\"["]}],"annotations":{"kubectl.kubernetes.io\/last-applied-configuration":"[{\"}","x":"true"},"finalizers":["a]"]},"spec":{"n":1.5e3,"b":false}}`),
		"empty metadata":           []byte(`{"kind":"X","apiVersion":"v1","metadata":{"name":"f","annotations":{},"labels":{}},"data":{}}`),
		"annotations not strings":  []byte(`{"kind":"X","apiVersion":"v1","metadata":{"name":"d","annotations":{"example.com/team":"t","kubectl.kubernetes.io/last-applied-configuration":"x"},"labels":{"app":"web","n":"1"}}}`),
	}
	goldens, _ := filepath.Glob("testdata/transform/*.input.yaml")
	for _, path := range goldens {
		b, err := json.Marshal(readObject(t, path).Object)
		if err != nil {
			t.Fatal(err)
		}
		inputs[filepath.Base(path)] = b
	}
	indexers := `[{name: byApp, type: label, key: app}, {name: byTeam, type: annotation, key: example.com/team}, {name: byOwner, type: owner}]`
	configs := map[string]string{
		"defaults":             `transform: {}`,
		"managedFields kept":   `transform: {stripManagedFields: false}`,
		"last-applied kept":    `transform: {stripLastAppliedConfiguration: false}`,
		"nothing stripped":     `transform: {stripManagedFields: false, stripLastAppliedConfiguration: false}`,
		"removeFields decodes": `transform: {removeFields: [data.k]}`,
	}
	gvk := schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
	for cname, c := range configs {
		cfg := loadResources(t, fmt.Sprintf("resources:\n  - {version: v1, resource: configmaps, %s, indexers: %s}\n", c, indexers))[0]
		read := reader{cuts: cutsOf(&cfg), typed: typeMembers("v1", "ConfigMap")}
		if cut := read.cuts != nil; cut != (cname != "removeFields decodes") {
			t.Fatalf("%s: cutsOf says cut = %v", cname, cut)
		}
		for iname, raw := range inputs {
			t.Run(cname+"/"+iname, func(t *testing.T) {
				u := &unstructured.Unstructured{}
				if err := json.Unmarshal(raw, &u.Object); err != nil {
					t.Fatal(err)
				}
				want, err := ingest(&cfg, indexersOf(&cfg), gvk)(u)
				if err != nil {
					t.Fatal(err)
				}
				w, err := read.read(raw, false)
				if err != nil && u.GetName() != "" {
					t.Fatal(err)
				}
				if err != nil {
					return // no metadata to key it by: the reflector could not queue it either
				}
				got, err := ingest(&cfg, indexersOf(&cfg), gvk)(w)
				if err != nil {
					t.Fatal(err)
				}
				sameObject(t, got.(*object.Object), want.(*object.Object))
			})
		}
	}
}

func sameObject(t *testing.T, got, want *object.Object) {
	t.Helper()
	if g, w := got.GetObjectMeta(), want.GetObjectMeta(); !reflect.DeepEqual(g, w) {
		t.Errorf("header = %+v, want %+v", g, w)
	}
	if g, w := valuesOf(got), valuesOf(want); !reflect.DeepEqual(normal(g), normal(w)) {
		t.Errorf("indexer values = %q, want %q", g, w)
	}
	var g, w any
	if err := json.Unmarshal(got.JSON(), &g); err != nil {
		t.Fatalf("kept JSON %s: %v", got.JSON(), err)
	}
	_ = json.Unmarshal(want.JSON(), &w)
	if !reflect.DeepEqual(g, w) {
		t.Errorf("JSON = %s\nwant %s", got.JSON(), want.JSON())
	}
	if len(got.JSON()) != cap(got.JSON()) {
		t.Errorf("kept JSON has capacity %d for %d bytes, want it exactly sized", cap(got.JSON()), len(got.JSON()))
	}
}

// normal is values with empty value lists as nil.
func normal(values [][]string) [][]string {
	out := make([][]string, len(values))
	for i, v := range values {
		if len(v) > 0 {
			out[i] = v
		}
	}
	return out
}

// TestAWatchStreamIsSplitIntoItsEvents: the frame reader splits a watch's stream into events
// however the reads cut it, with braces, quotes and escaped quotes inside strings, whitespace
// between events or none; a stream cut off mid-event ends with io.ErrUnexpectedEOF, and
// anything but an object between events is an error.
func TestAWatchStreamIsSplitIntoItsEvents(t *testing.T) {
	events := []string{
		`{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a}{","namespace":"n","resourceVersion":"1"},"data":{"q":"\"}\\","r":"\\\\\"{"}}}`,
		`{"type":"MODIFIED","object":{"metadata":{"name":"b","resourceVersion":"2"},"data":{"big":"` + strings.Repeat("x", 100<<10) + `"}}}`,
		`{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"3","annotations":{"k8s.io/initial-events-end":"true"}}}}`,
		`{"type":"DELETED","object":{"metadata":{"name":"c","resourceVersion":"4"}}}`,
		`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410,"message":"too old"}}`,
	}
	for name, stream := range map[string]string{
		"newlines": strings.Join(events, "\n") + "\n",
		"nothing":  strings.Join(events, ""),
		"spaces":   " \r\n\t" + strings.Join(events, "  \n "),
	} {
		for rname, r := range map[string]io.Reader{"whole": strings.NewReader(stream), "a byte at a time": iotest.OneByteReader(strings.NewReader(stream))} {
			t.Run(name+"/"+rname, func(t *testing.T) {
				d := &eventDecoder{frames: frameReader{r: r}, body: io.NopCloser(nil)}
				// Every event is read before any is checked: the reader's buffer is reused from
				// one event to the next, and nothing it returned may share it.
				type event struct {
					typ watch.EventType
					obj runtime.Object
				}
				var got []event
				for i := range events {
					typ, obj, err := d.Decode()
					if err != nil {
						t.Fatalf("event %d: %v", i, err)
					}
					got = append(got, event{typ, obj})
				}
				for i, want := range events {
					typ, obj := got[i].typ, got[i].obj
					if wantType := watch.EventType(strings.Split(want, `"`)[3]); typ != wantType {
						t.Errorf("event %d: type %s, want %s", i, typ, wantType)
					}
					switch o := obj.(type) {
					case *wire:
						if !strings.Contains(want, string(o.raw)) || !json.Valid(o.raw) {
							t.Errorf("event %d: object %.80s is not the event's", i, o.raw)
						}
						if typ == watch.Bookmark && o.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" {
							t.Errorf("bookmark without its annotations: %v", o.GetAnnotations())
						}
					case *metav1.Status:
						if o.Code != 410 || o.Reason != metav1.StatusReasonExpired {
							t.Errorf("error event: %+v", o)
						}
					default:
						t.Errorf("event %d: %T", i, obj)
					}
				}
				if _, _, err := d.Decode(); !errors.Is(err, io.EOF) {
					t.Errorf("after the last event: %v, want io.EOF", err)
				}
			})
		}
	}
	for name, c := range map[string]struct {
		stream string
		want   error
	}{
		"cut off":       {events[0] + "\n" + events[1][:50], io.ErrUnexpectedEOF},
		"not an object": {events[0] + "\nnull\n", nil},
		"not JSON":      {`{"type":"ADDED","object":{"metadata":{"name":"a",}}}`, nil},
		"no object":     {`{"type":"ADDED"}`, nil},
		"unknown type":  {`{"type":"SOMETHING","object":{"metadata":{"name":"a"}}}`, nil},
	} {
		t.Run(name, func(t *testing.T) {
			d := &eventDecoder{frames: frameReader{r: strings.NewReader(c.stream)}, body: io.NopCloser(nil)}
			var err error
			for range 3 {
				if _, _, err = d.Decode(); err != nil {
					break
				}
			}
			if err == nil || errors.Is(err, io.EOF) || (c.want != nil && !errors.Is(err, c.want)) {
				t.Errorf("got %v, want an error (%v)", err, c.want)
			}
		})
	}
}

// TestAListPageIsReadAsWireObjects: a list's page keeps its resourceVersion, continue token,
// remaining count and each item as the JSON it was sent as.
func TestAListPageIsReadAsWireObjects(t *testing.T) {
	body := []byte(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"99","continue":"c1","remainingItemCount":5},"items":[{"metadata":{"name":"a","namespace":"n","resourceVersion":"1"},"data":{"k":"v"}},{"metadata":{"name":"b","namespace":"n","resourceVersion":"2"}}]}`)
	list, err := reader{}.list(body)
	if err != nil {
		t.Fatal(err)
	}
	if list.ResourceVersion != "99" || list.Continue != "c1" || list.RemainingItemCount == nil || *list.RemainingItemCount != 5 || len(list.Items) != 2 {
		t.Fatalf("list = %+v", list)
	}
	if w := list.Items[0]; w.Name != "a" || w.Namespace != "n" || w.ResourceVersion != "1" || !bytes.Equal(w.raw, []byte(`{"metadata":{"name":"a","namespace":"n","resourceVersion":"1"},"data":{"k":"v"}}`)) {
		t.Errorf("item 0 = %+v %s", w.ObjectMeta, w.raw)
	}
	if _, err := (reader{}).list(body[:40]); err == nil {
		t.Error("a truncated list was read without an error")
	}
	if c := list.DeepCopyObject().(*wireList); &c.Items[0].raw[0] == &list.Items[0].raw[0] || c.Items[1].Name != "b" {
		t.Error("DeepCopyObject shares the items' JSON")
	}
}

// TestAMetadataOnlyReaderRefusesWholeObjects: a reader of metadata only refuses an object that is
// not PartialObjectMetadata, naming what it got (an aggregated apiserver that ignores the
// Accept header's as= would send whole objects), so that a metadata-only cache never keeps,
// serves or delivers an object's body. A bookmark carries no body, and passes.
func TestAMetadataOnlyReaderRefusesWholeObjects(t *testing.T) {
	r := reader{metadataOnly: true}
	partial := `{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"a","namespace":"n","resourceVersion":"1"}}`
	list := func(items ...string) []byte {
		return []byte(`{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"9"},"items":[` + strings.Join(items, ",") + `]}`)
	}
	if l, err := r.list(list(partial)); err != nil || len(l.Items) != 1 || l.Items[0].Name != "a" {
		t.Fatalf("a list of PartialObjectMetadata: %+v, %v", l, err)
	}
	if _, obj, err := r.event([]byte(`{"type":"ADDED","object":` + partial + `}`)); err != nil || obj.(*wire).Name != "a" {
		t.Fatalf("an event of PartialObjectMetadata: %v", err)
	}
	for _, whole := range []string{
		`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"b","namespace":"n","resourceVersion":"2"},"data":{"password":"p"}}`,
		`{"metadata":{"name":"c","namespace":"n","resourceVersion":"3"},"data":{"password":"p"}}`, // a list's item without its kind
	} {
		if _, err := r.list(list(partial, whole)); err == nil || !strings.Contains(err.Error(), "PartialObjectMetadata") {
			t.Errorf("a list holding %s: err %v, want one naming PartialObjectMetadata", whole, err)
		}
		if _, _, err := r.event([]byte(`{"type":"MODIFIED","object":` + whole + `}`)); err == nil || !strings.Contains(err.Error(), "PartialObjectMetadata") {
			t.Errorf("an event of %s: err %v, want one naming PartialObjectMetadata", whole, err)
		}
	}
	if _, _, err := r.event([]byte(`{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"10"}}}`)); err != nil {
		t.Errorf("a bookmark: %v", err)
	}
}
