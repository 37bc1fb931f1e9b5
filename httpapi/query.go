package httpapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/url"
	"slices"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/utils/ptr"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/object"
	"github.com/tidwall/gjson"
)

// query is a list or watch request's parameters, parsed. Whether the request is a watch is
// the target's to say (target.watch).
type query struct {
	labels     labels.Selector
	fields     fields.Selector
	fieldPaths map[string][]string // fieldSelector field → the steps to its value in an object's JSON (see selectFields)
	name       string              // set for a watch of one object (a path with a name)
	index      string              // explicit index=NAME
	value      string              // and value=V
	limit      int
	after      string // continue: the last key of the previous page
	listRV     string // continue: the resourceVersion of the first page
	pinned     uint64 // continue: the id of the first page's snapshot (see pins)
	past       bool   // continue: the list is of the history, at listRV (see api.past)

	resourceVersion uint64
	// options are the list options as given, which a list and a watch check as the apiserver
	// does (see checkOptions).
	options             internalversion.ListOptions
	sendInitialEvents   bool
	allowWatchBookmarks bool
	timeoutSeconds      int64
}

// parseQuery parses the query string. Errors are 400s naming the parameter.
func parseQuery(v url.Values, maxPage int) (*query, *apierrors.StatusError) {
	q := &query{limit: maxPage}
	var err error
	if q.labels, err = labels.Parse(v.Get("labelSelector")); err != nil {
		return nil, badParameter("labelSelector", "%v", err)
	}
	if q.fields, err = fields.ParseSelector(v.Get("fieldSelector")); err != nil {
		return nil, badParameter("fieldSelector", "%v", err)
	}
	q.index, q.value = v.Get("index"), v.Get("value")
	if (q.index == "") != (!v.Has("value")) {
		return nil, badParameter("index", "index and value must be given together")
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return nil, badParameter("limit", "must be a non-negative integer, got %q", s)
		}
		if n > 0 && n < maxPage {
			q.limit = n
		}
	}
	if s := v.Get("continue"); s != "" {
		var tok continueToken
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err == nil {
			err = json.Unmarshal(b, &tok)
		}
		if err != nil || tok.After == "" {
			return nil, badParameter("continue", "invalid continue token")
		}
		q.after, q.listRV, q.pinned, q.past = tok.After, tok.RV, tok.Snapshot, tok.Past
	}
	if s := v.Get("resourceVersion"); s != "" {
		if q.resourceVersion, err = strconv.ParseUint(s, 10, 64); err != nil {
			return nil, badParameter("resourceVersion", "must be a resourceVersion from this API, got %q", s)
		}
	}
	q.options = internalversion.ListOptions{ResourceVersion: v.Get("resourceVersion"), Continue: v.Get("continue"),
		ResourceVersionMatch: metav1.ResourceVersionMatch(v.Get("resourceVersionMatch"))}
	if v.Has("sendInitialEvents") {
		q.options.SendInitialEvents = ptr.To(boolParameter(v, "sendInitialEvents"))
	}
	q.sendInitialEvents, q.allowWatchBookmarks = boolParameter(v, "sendInitialEvents"), boolParameter(v, "allowWatchBookmarks")
	if s := v.Get("timeoutSeconds"); s != "" {
		if q.timeoutSeconds, err = strconv.ParseInt(s, 10, 64); err != nil || q.timeoutSeconds < 0 {
			return nil, badParameter("timeoutSeconds", "must be a non-negative integer, got %q", s)
		}
	}
	return q, nil
}

// boolParameter reads the boolean query parameter name as the apiserver reads it
// (runtime.Convert_Slice_string_To_bool): absent, "0" and "false" in any case are false;
// any other value, the empty string included, is true.
func boolParameter(v url.Values, name string) bool {
	values, b := v[name], false
	_ = runtime.Convert_Slice_string_To_bool(&values, &b, nil) // it never fails
	return b
}

// selectFields checks the field selector's fields against those the resource accepts and
// notes where each is found in its objects.
func (q *query) selectFields(s selectable) *apierrors.StatusError {
	q.fieldPaths = map[string][]string{}
	for _, r := range q.fields.Requirements() {
		p, err := s.path(r.Field)
		if err != nil {
			return err
		}
		q.fieldPaths[r.Field] = jsonSteps(p)
	}
	return nil
}

type continueToken struct {
	RV       string `json:"rv"`
	After    string `json:"after"`
	Snapshot uint64 `json:"snapshot,omitempty"`
	// Past marks a list of the history at RV: its pages are read from the history.
	Past bool `json:"past,omitempty"`
}

func encodeContinue(rv, after string, snapshot uint64) string {
	b, _ := json.Marshal(continueToken{RV: rv, After: after, Snapshot: snapshot})
	return base64.RawURLEncoding.EncodeToString(b)
}

// matches reports whether obj is in namespace (if set) and matches the selectors.
func (q *query) matches(obj *object.Object, namespace string) bool {
	if (namespace != "" && obj.GetNamespace() != namespace) || (q.name != "" && obj.GetName() != q.name) {
		return false
	}
	if !q.labels.Empty() && !q.labels.Matches(obj.Labels()) {
		return false
	}
	if q.fields.Empty() {
		return true
	}
	set := make(fields.Set, len(q.fieldPaths))
	for field, path := range q.fieldPaths {
		set[field] = fieldValue(obj.JSON(), path)
	}
	return q.fields.Matches(set)
}

// jsonSteps are the keys of a dot path as fieldValue reads them.
func jsonSteps(path []string) []string {
	steps := make([]string, len(path))
	for i, key := range path {
		steps[i] = gjson.Escape(key)
	}
	return steps
}

// fieldValue is the string form of the scalar at path in an object's JSON (a string's value,
// a number or a bool as JSON writes it), or "" when there is none: read from the JSON, without
// decoding the object. Each step is a key of an object, never an index into an array.
func fieldValue(obj []byte, path []string) string {
	v := gjson.ParseBytes(obj)
	for _, step := range path {
		if !v.IsObject() {
			return ""
		}
		v = v.Get(step)
	}
	switch v.Type {
	case gjson.String:
		return v.Str
	case gjson.Number, gjson.True, gjson.False:
		return v.Raw
	default:
		return ""
	}
}

// lookup is how candidates were found (strategy: "index/NAME" or "scan"): in key order
// (inOrder: a configured index's objects of one value, or the whole cache, within a namespace
// when the query has one), which a page reads only as far as it needs; or, for several values
// of an index or the namespace index, as objs in no order.
type lookup struct {
	strategy string
	inOrder  bool
	ordered  dynamicinformer.Snapshot
	objs     []*object.Object
}

// candidates returns a superset of the objects the query selects, through an index when one
// applies: the explicit index, a label indexer for an equality or set requirement of the
// label selector, a jsonPath indexer for an equality of the field selector; otherwise the
// cache in key order. All of them are read from snap.
func (q *query) candidates(r *dynamicinformer.Resource, snap dynamicinformer.Snapshot) (lookup, *apierrors.StatusError) {
	cfg := r.Config()
	if q.index != "" {
		if q.index != config.NamespaceIndex && !slices.ContainsFunc(cfg.Indexers, func(ix config.Indexer) bool { return ix.Name == q.index }) {
			return lookup{}, badParameter("index", "%s has no index %q", r.Name(), q.index)
		}
		return byIndex(snap, q.index, q.value)
	}
	if reqs, ok := q.labels.Requirements(); ok {
		for _, req := range reqs {
			if req.Operator() != selection.Equals && req.Operator() != selection.DoubleEquals && req.Operator() != selection.In {
				continue
			}
			for _, ix := range cfg.Indexers {
				if ix.Type == config.IndexLabel && ix.Key == req.Key() {
					return byIndex(snap, ix.Name, req.Values().UnsortedList()...)
				}
			}
		}
	}
	for _, req := range q.fields.Requirements() {
		if req.Operator != selection.Equals && req.Operator != selection.DoubleEquals {
			continue
		}
		for _, ix := range cfg.Indexers {
			if p, ok := config.DotPath(ix.Path); ok && ix.Type == config.IndexJSONPath && p == req.Field {
				return byIndex(snap, ix.Name, req.Value)
			}
		}
	}
	return lookup{strategy: "scan", inOrder: true, ordered: snap}, nil
}

// byIndex looks objects up by index: one value of a configured index in order, anything
// else (several values, the namespace index) as objs, in no order.
func byIndex(snap dynamicinformer.Snapshot, index string, values ...string) (lookup, *apierrors.StatusError) {
	l := lookup{strategy: "index/" + index}
	if len(values) == 1 {
		if ordered, ok := snap.ByIndex(index, values[0]); ok {
			l.inOrder, l.ordered = true, ordered
			return l, nil
		}
	}
	collect := func(o *object.Object) bool {
		l.objs = append(l.objs, o)
		return true
	}
	for _, v := range values {
		if index == config.NamespaceIndex {
			snap.Scan(v, dynamicinformer.Key{}, collect)
			continue
		}
		ordered, ok := snap.ByIndex(index, v)
		if !ok {
			// Only a configured index is asked for: this is a bug, and its detail is not the caller's.
			return lookup{}, apierrors.NewInternalError(errors.New("the index could not be read"))
		}
		ordered.Scan("", dynamicinformer.Key{}, collect)
	}
	if len(values) > 1 { // an object can carry several of the values
		slices.SortFunc(l.objs, object.CompareObjects)
		l.objs = slices.CompactFunc(l.objs, func(a, b *object.Object) bool { return object.CompareObjects(a, b) == 0 })
	}
	return l, nil
}

// page is one page of a list: the selected objects in key order after the cursor.
type page struct {
	items     []*object.Object
	last      string // the key of the last item, when more may follow it; else ""
	next      string // the continue token, "" on the last page
	remaining *int64 // objects after this page, counted only for a list without selectors
}

type keyed struct {
	key string
	obj *object.Object
}

// checkEvery is how many objects a scan matches between looks at its context: a cancelled
// or timed-out request stops within a fraction of a millisecond of matching.
const checkEvery = 256

// unselected reports whether the query selects every object of its scope, so that a page
// can say how many objects follow it, as the apiserver does only then.
func (q *query) unselected() bool { return q.labels.Empty() && q.fields.Empty() && q.name == "" }

// paginate cuts the page after the cursor from the candidates, in key order: by namespace,
// then name. Ordering by key makes paging stable while objects change: an object that exists
// throughout a paged list is returned exactly once. A scan reads the cache in key order from
// the cursor and stops at the page's last match, as the apiserver reads etcd: a page that
// ends before the last object has a continue token even when nothing after it matches. It
// stops with ctx's error when ctx ends.
func (q *query) paginate(ctx context.Context, l lookup, namespace string) (page, error) {
	if l.inOrder {
		return q.scan(ctx, l.ordered, namespace)
	}
	selected := make([]keyed, 0, len(l.objs))
	for i, o := range l.objs {
		if i%checkEvery == 0 && ctx.Err() != nil {
			return page{}, ctx.Err()
		}
		if !q.matches(o, namespace) {
			continue
		}
		if k := object.KeyOf(o); q.after == "" || object.CompareKeys(k, q.after) > 0 {
			selected = append(selected, keyed{k, o})
		}
	}
	slices.SortFunc(selected, func(a, b keyed) int { return object.CompareKeys(a.key, b.key) })
	if err := ctx.Err(); err != nil {
		return page{}, err
	}
	n := min(len(selected), q.limit)
	p := page{items: make([]*object.Object, n)}
	for i := range n {
		p.items[i] = selected[i].obj
	}
	if len(selected) > n {
		p.last = selected[n-1].key
		if q.unselected() {
			rest := int64(len(selected) - n)
			p.remaining = &rest
		}
	}
	return p, nil
}

// scan reads a page from the cache in key order.
func (q *query) scan(ctx context.Context, ordered dynamicinformer.Snapshot, namespace string) (page, error) {
	var after dynamicinformer.Key
	if q.after != "" {
		after.Namespace, after.Name = object.SplitKey(q.after)
	}
	var p page
	var err error
	var rest int64
	more, seen := false, 0
	ordered.Scan(namespace, after, func(o *object.Object) bool {
		if seen++; seen%checkEvery == 0 && ctx.Err() != nil {
			err = ctx.Err()
			return false
		}
		if len(p.items) == q.limit {
			more = true
			if !q.unselected() {
				return false
			}
			rest++
			return true
		}
		if q.matches(o, namespace) {
			p.items = append(p.items, o)
		}
		return true
	})
	if err != nil {
		return page{}, err
	}
	if more {
		p.last = object.KeyOf(p.items[len(p.items)-1])
		if q.unselected() {
			p.remaining = &rest
		}
	}
	return p, nil
}
