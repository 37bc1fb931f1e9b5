package dynamicinformer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unsafe"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/object"
	"github.com/tidwall/gjson"
)

// NewJSONClient is the client the caches list and watch objects with (Options.JSON): it asks the
// apiserver for JSON only, whatever client.cbor says, because the cache keeps each object's
// JSON as the apiserver sent it, less what the transforms strip, without decoding it into maps
// and encoding it again. A cache of metadata only asks for it so too (see jsonLister).
func NewJSONClient(c *rest.Config) (rest.Interface, error) {
	c = rest.CopyConfig(c)
	c.ContentType = "application/json"
	c.AcceptContentTypes = "application/json"
	c.GroupVersion = &schema.GroupVersion{Version: "v1"}       // of the apiserver's errors (Status)
	c.NegotiatedSerializer = scheme.Codecs.WithoutConversion() // to read them
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	return rest.UnversionedRESTClientFor(c)
}

// wire is an object as a list or watch brought it in, before the informer's transform keeps it
// as an Object: its JSON, a copy of what was received, already cut to what the cache keeps when
// cut is set (see reader), and the metadata client-go's reflector and queue read (namespace,
// name, uid, resourceVersion; annotations for a bookmark only).
type wire struct {
	metav1.PartialObjectMetadata
	raw []byte
	cut bool
	// managers summarises the managedFields cut from raw (see object.ManagersOf).
	managers object.Managers
}

// DeepCopyObject copies w; client-go's informers do not call it on what they queue.
func (w *wire) DeepCopyObject() runtime.Object {
	c := &wire{raw: bytes.Clone(w.raw), cut: w.cut, managers: w.managers}
	w.DeepCopyInto(&c.PartialObjectMetadata)
	return c
}

// wireList is a list's page of wire objects.
type wireList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []*wire
}

// DeepCopyObject copies l.
func (l *wireList) DeepCopyObject() runtime.Object {
	c := &wireList{TypeMeta: l.TypeMeta, Items: make([]*wire, len(l.Items))}
	l.DeepCopyInto(&c.ListMeta)
	for i, w := range l.Items {
		c.Items[i] = w.DeepCopyObject().(*wire)
	}
	return c
}

// jsonLister lists and watches the objects of gvr in namespace ("" for all) as JSON, read into
// wire objects: whole, or with read.metadataOnly their metadata, which the apiserver sends as
// PartialObjectMetadata when asked for it (as client-go's metadata client asks, but in JSON).
type jsonLister struct {
	client    rest.Interface
	gvr       schema.GroupVersionResource
	namespace string
	read      reader
	resume    *resume // nil: nothing to resume from
}

// reader reads an object's JSON, as received, into a wire object of its own: cut to what the
// cache keeps where the resource's transforms allow (cuts, with apiVersion and kind put in
// where the object has none), else copied whole for the transform to decode. Either way nothing
// of the list's body or the watch's buffer is kept.
type reader struct {
	cuts  *cuts
	typed string // see typeMembers
	// metadataOnly refuses an object that is not PartialObjectMetadata, a bookmark aside: a
	// server that ignores the Accept header's as= (an aggregated one) would send whole objects,
	// which a metadata-only cache must never keep, serve or deliver.
	metadataOnly bool
}

func (r reader) read(raw []byte, bookmark bool) (*wire, error) {
	if r.metadataOnly && !bookmark {
		if kind := gjson.GetBytes(raw, "kind"); kind.Str != "PartialObjectMetadata" {
			return nil, fmt.Errorf("decode an object: asked for PartialObjectMetadata, got kind %q", kind.Str)
		}
	}
	if r.cuts == nil || bookmark {
		return newWire(bytes.Clone(raw), bookmark)
	}
	cut, managers := r.cuts.apply(raw, r.typed)
	w, err := newWire(cut, false)
	if w != nil {
		w.cut, w.managers = true, managers
	}
	return w, err
}

func (l jsonLister) request(o metav1.ListOptions) *rest.Request {
	prefix := []string{"apis", l.gvr.Group, l.gvr.Version}
	if l.gvr.Group == "" {
		prefix = []string{"api", l.gvr.Version}
	}
	req := l.client.Get().AbsPath(prefix...).NamespaceIfScoped(l.namespace, l.namespace != "").Resource(l.gvr.Resource).
		SpecificallyVersionedParams(&o, metav1.ParameterCodec, metav1.SchemeGroupVersion)
	if l.read.metadataOnly {
		as := "PartialObjectMetadataList"
		if o.Watch {
			as = "PartialObjectMetadata" // each event's object
		}
		req.SetHeader("Accept", "application/json;as="+as+";g=meta.k8s.io;v=v1")
	}
	return req
}

func (l jsonLister) List(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	if o.Continue == "" {
		objs, rev, ok, err := l.resume.take(ctx, l.gvr)
		if err != nil {
			return nil, err
		}
		if ok {
			return l.resumeList(objs, rev)
		}
	}
	result := l.request(o).Do(ctx)
	if err := result.Error(); err != nil {
		return nil, err // the apiserver's Status, as an API error (Raw returns it undecoded)
	}
	body, _ := result.Raw()
	return l.read.list(body)
}

func (l jsonLister) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	if o.SendInitialEvents != nil && *o.SendInitialEvents {
		objs, rev, ok, err := l.resume.take(ctx, l.gvr)
		if err != nil {
			return nil, err
		}
		if ok {
			list, err := l.resumeList(objs, rev)
			if err != nil {
				return nil, err
			}
			return l.resumeWatch(ctx, o, list), nil
		}
	}
	return l.watch(ctx, o)
}

// watch watches the apiserver.
func (l jsonLister) watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	o.Watch = true
	body, err := l.request(o).Stream(ctx)
	if err != nil {
		return nil, err
	}
	return watch.NewStreamWatcher(&eventDecoder{frames: frameReader{r: body}, body: body, read: l.read},
		apierrors.NewClientErrorReporter(http.StatusInternalServerError, "GET", "ClientWatchDecoding")), nil
}

// list reads a list's page: its metadata, and each item as a wire object.
func (r reader) list(body []byte) (*wireList, error) {
	doc := docOf(body)
	if !gjson.Valid(doc) {
		return nil, errors.New("decode a list: not valid JSON")
	}
	list := &wireList{}
	meta := gjson.Get(doc, "metadata")
	// Copies: the reflector keeps them, and they would keep the whole body.
	list.ResourceVersion = strings.Clone(meta.Get("resourceVersion").Str)
	list.Continue = strings.Clone(meta.Get("continue").Str)
	if n := meta.Get("remainingItemCount"); n.Exists() {
		v := n.Int()
		list.RemainingItemCount = &v
	}
	var err error
	gjson.Get(doc, "items").ForEach(func(_, item gjson.Result) bool {
		var w *wire
		if w, err = r.read(sliceOf(body, item), false); err != nil {
			return false
		}
		list.Items = append(list.Items, w)
		return true
	})
	return list, err
}

// eventDecoder reads a watch's events as wire objects (watch.Decoder).
type eventDecoder struct {
	frames frameReader
	body   io.Closer
	read   reader
}

func (d *eventDecoder) Decode() (watch.EventType, runtime.Object, error) {
	frame, err := d.frames.next()
	if err != nil {
		return "", nil, err
	}
	return d.read.event(frame)
}

func (d *eventDecoder) Close() { _ = d.body.Close() }

// event reads one watch event, {"type": ..., "object": {...}}, as the apiserver writes it;
// nothing of frame is kept.
func (r reader) event(frame []byte) (watch.EventType, runtime.Object, error) {
	doc := docOf(frame)
	if !gjson.Valid(doc) {
		return "", nil, errors.New("decode a watch event: not valid JSON")
	}
	typ, obj := gjson.Get(doc, "type"), gjson.Get(doc, "object")
	if !obj.IsObject() {
		return "", nil, fmt.Errorf("decode a watch event: no object in a %q event", typ.Str)
	}
	raw := sliceOf(frame, obj)
	// The event's type is one of watch's constants, not a string of frame, which is reused.
	switch t := eventType(typ.Str); t {
	case watch.Error:
		status := &metav1.Status{}
		if err := utiljson.Unmarshal(raw, status); err != nil {
			return "", nil, fmt.Errorf("decode a watch error: %w", err)
		}
		return t, status, nil
	case watch.Added, watch.Modified, watch.Deleted, watch.Bookmark:
		w, err := r.read(raw, t == watch.Bookmark)
		return t, w, err
	default:
		return "", nil, fmt.Errorf("decode a watch event: unknown type %q", typ.Str)
	}
}

// eventType is s as one of watch's event types, "" for none: a constant, not sharing s's memory.
func eventType(s string) watch.EventType {
	for _, t := range [...]watch.EventType{watch.Added, watch.Modified, watch.Deleted, watch.Bookmark, watch.Error} {
		if s == string(t) {
			return t
		}
	}
	return ""
}

// newWire reads the metadata of raw, an object's JSON, which it keeps; its annotations only
// when bookmark.
func newWire(raw []byte, bookmark bool) (*wire, error) {
	w := &wire{raw: raw}
	gjson.Parse(docOf(raw)).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "apiVersion":
			w.APIVersion = v.Str
		case "kind":
			w.Kind = v.Str
		case "metadata":
			v.ForEach(func(k, v gjson.Result) bool {
				switch k.Str {
				case "namespace":
					w.Namespace = v.Str
				case "name":
					w.Name = v.Str
				case "uid":
					w.UID = types.UID(v.Str)
				case "resourceVersion":
					w.ResourceVersion = v.Str
				case "annotations":
					if bookmark {
						w.Annotations = map[string]string{}
						v.ForEach(func(k, v gjson.Result) bool { w.Annotations[k.Str] = v.Str; return true })
					}
				}
				return true
			})
		}
		return true
	})
	if w.ResourceVersion == "" && w.Name == "" {
		return nil, errors.New("decode an object: no metadata")
	}
	return w, nil
}

// frameReader splits a stream of JSON objects, as the apiserver writes a watch (each followed by
// a newline, which it does not rely on), into one object per call. It checks only their
// nesting; reader.event checks the rest.
type frameReader struct {
	r          io.Reader
	buf        []byte
	start, end int // buf[start:end] is read and not yet returned
}

// next is the next object, valid until the next call.
func (f *frameReader) next() ([]byte, error) {
	depth, inString := 0, false
	i := f.start
	for {
		for i < f.end {
			if inString {
				q := bytes.IndexByte(f.buf[i:f.end], '"')
				if q < 0 {
					i = f.end
					break
				}
				i += q
				if !object.Escaped(f.buf[f.start:i]) {
					inString = false
				}
				i++
				continue
			}
			switch c := f.buf[i]; c {
			case '"':
				inString = true
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					frame := f.buf[f.start : i+1]
					f.start = i + 1
					return frame, nil
				}
			case ' ', '\t', '\r', '\n':
				if depth == 0 {
					f.start = i + 1
				}
			default:
				if depth == 0 {
					return nil, fmt.Errorf("decode a watch event: unexpected %q between events", c)
				}
			}
			i++
		}
		if err := f.fill(&i); err != nil {
			if errors.Is(err, io.EOF) && f.start < f.end {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
}

// fill reads more of the stream, keeping buf[start:end] and moving it to the front; *i, a
// position in it, moves with it.
func (f *frameReader) fill(i *int) error {
	*i -= f.start
	switch {
	case f.start == f.end && len(f.buf) > object.MaxScratch:
		f.buf = nil // one huge object does not pin its buffer
	case f.start > 0:
		copy(f.buf, f.buf[f.start:f.end])
	}
	f.start, f.end = 0, f.end-f.start
	if f.end == len(f.buf) {
		f.buf = append(f.buf, make([]byte, max(len(f.buf), 32<<10))...)
	}
	for {
		n, err := f.r.Read(f.buf[f.end:])
		f.end += n
		if n > 0 {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// docOf is b as a string, sharing its memory; b must not be modified while it is used.
func docOf(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// sliceOf is the part of b that r, a value gjson read from docOf(b), was read from.
func sliceOf(b []byte, r gjson.Result) []byte {
	if r.Index > 0 || (len(b) > 0 && len(r.Raw) == len(b)) {
		return b[r.Index : r.Index+len(r.Raw) : r.Index+len(r.Raw)]
	}
	return []byte(r.Raw)
}
