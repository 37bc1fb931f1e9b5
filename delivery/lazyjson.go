package delivery

import (
	"reflect"
	"strconv"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"github.com/tidwall/gjson"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/dynwatch/dynwatch/config"
)

// A filter reads an object as CEL values made from the JSON the cache keeps, as far as the
// expression goes and no further: `object.metadata.labels["app"]` scans the object's keys for
// metadata, metadata's for labels and labels' for app, and decodes that one string, where
// decoding the whole object first cost 24 µs for a configmap of 2 KB and 96 µs for a pod of
// 4 KB. A scalar reached is what the object decoded as unstructured would hold (a number is
// an int when its literal is one, else a double); a map or a list is read lazily for a key, an
// index, a size or a membership test, and decoded whole, once, for anything else (iteration,
// equality, conversion), then handled by CEL's own map and list.
//
// A map answers its first scannedLookups lookups of distinct keys by scanning, as far as the
// key, and remembers each answer, so that a key looked up again (`object.metadata` in each half
// of a filter) is not scanned for again; the next distinct key indexes it whole, once, and
// every later lookup is a map access. A list is scanned for its first lookup and indexed whole
// at its second. Every lookup of a key returns the same value. A scan per lookup made
// `object.data[k]`, inside an iteration over the keys, cost a scan of every key for each: a
// filter CEL's cost limit bounds in operations ran for minutes on a configmap of 40,000 keys.
// Indexing a map at its second lookup had a filter on a pod of 4 KB read the whole pod to
// find `metadata` again: over a third of the filter's time (docs/benchmarks-history.md, "A key
// looked up again, answered from its first scan").

// jsonValue is r as a CEL value.
func jsonValue(r gjson.Result) ref.Val {
	switch r.Type {
	case gjson.Null:
		return types.NullValue
	case gjson.False:
		return types.False
	case gjson.True:
		return types.True
	case gjson.String:
		return types.String(r.Str)
	case gjson.Number:
		if i, err := strconv.ParseInt(r.Raw, 10, 64); err == nil {
			return types.Int(i)
		}
		f, err := strconv.ParseFloat(r.Raw, 64)
		if err != nil {
			return types.NewErr("the number %s: %v", r.Raw, err)
		}
		return types.Double(f)
	case gjson.JSON:
		if r.IsArray() {
			return &jsonList{lazy: lazy{raw: r, typ: types.ListType, size: -1}}
		}
		return newJSONMap(r)
	}
	return types.NewErr("not a JSON value: %q", r.Raw)
}

// decoded is raw decoded as the unstructured decoder decodes it, as a CEL value.
func decoded(raw gjson.Result) ref.Val {
	var v any
	if err := utiljson.Unmarshal([]byte(raw.Raw), &v); err != nil {
		return types.NewErr("decode: %v", err)
	}
	return types.DefaultTypeAdapter.NativeToValue(v)
}

// lazy is what a JSON object and a JSON array share: the bytes, their count once made, and
// the value decoded whole once needed.
type lazy struct {
	raw  gjson.Result
	typ  *types.Type // types.MapType or types.ListType
	size int         // members or elements, once counted; -1 before
	full ref.Val     // decoded whole, once needed
}

func (z *lazy) whole() ref.Val {
	if z.full == nil {
		z.full = decoded(z.raw)
	}
	return z.full
}

// Size implements traits.Sizer. CEL's cost tracking asks it of every map or list an operator
// is given, so it is counted once.
func (z *lazy) Size() ref.Val {
	if z.size < 0 {
		z.size = 0
		z.raw.ForEach(func(_, _ gjson.Result) bool { z.size++; return true })
	}
	return types.Int(z.size)
}

// IsEmpty implements config.Emptier: whether the object or array has no members, read from its
// first bytes, so that CEL's cost tracking does not count them where the count cannot change
// its charge (`oldObject == null`).
func (z *lazy) IsEmpty() bool {
	if z.size >= 0 {
		return z.size == 0
	}
	opened := false
	for _, c := range []byte(z.raw.Raw) {
		switch c {
		case ' ', '\t', '\n', '\r':
		case '{', '[':
			if opened {
				return false
			}
			opened = true
		case '}', ']':
			return true
		default:
			return false
		}
	}
	return true
}

func (z *lazy) ConvertToNative(t reflect.Type) (any, error) { return z.whole().ConvertToNative(t) }

func (z *lazy) Equal(other ref.Val) ref.Val { return z.whole().Equal(other) }

func (z *lazy) Value() any { return z.whole().Value() }

func (z *lazy) Type() ref.Type { return z.typ }

// convert is self (whose lazy z is) converted to t.
func (z *lazy) convert(self ref.Val, t ref.Type) ref.Val {
	switch t {
	case z.typ:
		return self
	case types.TypeType:
		return z.typ
	}
	return z.whole().ConvertToType(t)
}

// scannedLookups is how many distinct keys a map looks up by scanning before it indexes itself
// whole: more than a filter names in one map, few enough that an iteration's lookups stay
// bounded by the map's size.
const scannedLookups = 8

// jsonMap is a JSON object as a CEL map of strings to values.
type jsonMap struct {
	lazy
	scanned []scanned          // the keys looked up by scanning, and what each scan found
	members map[string]ref.Val // every member's value by its key, once indexed
}

// scanned is a key a map was scanned for and the value found: nil when the key is not a member.
type scanned struct {
	key string
	val ref.Val
}

var (
	_ traits.Mapper  = (*jsonMap)(nil)
	_ config.Emptier = (*jsonMap)(nil)
	_ config.Emptier = (*jsonList)(nil)
)

// newJSONMap is the JSON object r.
func newJSONMap(r gjson.Result) *jsonMap {
	return &jsonMap{lazy: lazy{raw: r, typ: types.MapType, size: -1}}
}

// Find implements traits.Mapper: a member's value by its key, a string.
func (m *jsonMap) Find(key ref.Val) (ref.Val, bool) {
	k, ok := key.(types.String)
	if !ok {
		if types.IsUnknownOrError(key) {
			return key, false
		}
		return nil, false // a JSON object's keys are strings
	}
	if m.members != nil {
		v, found := m.members[string(k)]
		return v, found
	}
	for _, s := range m.scanned {
		if s.key == string(k) {
			return s.val, s.val != nil
		}
	}
	if len(m.scanned) == scannedLookups {
		m.index()
		v, found := m.members[string(k)]
		return v, found
	}
	var found ref.Val
	m.raw.ForEach(func(name, value gjson.Result) bool {
		if name.Str == string(k) {
			found = jsonValue(value)
			return false
		}
		return true
	})
	m.scanned = append(m.scanned, scanned{key: string(k), val: found})
	return found, found != nil
}

// index reads every member into members, keeping the values the scans found: a key gives the
// same value each time.
func (m *jsonMap) index() {
	m.members = make(map[string]ref.Val)
	m.raw.ForEach(func(name, value gjson.Result) bool {
		m.members[name.Str] = jsonValue(value)
		return true
	})
	for _, s := range m.scanned {
		if s.val != nil {
			m.members[s.key] = s.val
		}
	}
	m.scanned = nil
}

// Get implements traits.Indexer.
func (m *jsonMap) Get(key ref.Val) ref.Val {
	v, found := m.Find(key)
	if !found {
		return types.ValOrErr(v, "no such key: %v", key)
	}
	return v
}

// Contains implements traits.Container: whether key is a key of the map.
func (m *jsonMap) Contains(key ref.Val) ref.Val {
	v, found := m.Find(key)
	if !found && v != nil {
		return v
	}
	return types.Bool(found)
}

func (m *jsonMap) Iterator() traits.Iterator { return m.whole().(traits.Mapper).Iterator() }

func (m *jsonMap) ConvertToType(t ref.Type) ref.Val { return m.convert(m, t) }

// jsonList is a JSON array as a CEL list.
type jsonList struct {
	lazy
	lookups  int       // indexes looked up so far
	elements []ref.Val // every element's value, from the second lookup on
}

// lookup counts a lookup and reports whether it is the first: later ones use an index.
func (l *jsonList) lookup() (first bool) {
	l.lookups++
	return l.lookups == 1
}

var _ traits.Lister = (*jsonList)(nil)

// Get implements traits.Indexer: an element by its index.
func (l *jsonList) Get(index ref.Val) ref.Val {
	i, err := types.GetOrError(index)
	if err != nil {
		return types.ValOrErr(index, "%v", err)
	}
	if !l.lookup() {
		if l.elements == nil {
			l.elements = []ref.Val{}
			l.raw.ForEach(func(_, value gjson.Result) bool {
				l.elements = append(l.elements, jsonValue(value))
				return true
			})
		}
		if i < 0 || i >= len(l.elements) {
			return types.NewErr("index '%d' out of range in list size '%d'", i, len(l.elements))
		}
		return l.elements[i]
	}
	var found ref.Val
	n := 0
	l.raw.ForEach(func(_, value gjson.Result) bool {
		if n == i {
			found = jsonValue(value)
			return false
		}
		n++
		return true
	})
	if found == nil {
		return types.NewErr("index '%d' out of range in list size '%d'", i, l.Size())
	}
	return found
}

func (l *jsonList) Contains(v ref.Val) ref.Val { return l.whole().(traits.Lister).Contains(v) }

func (l *jsonList) Add(other ref.Val) ref.Val { return l.whole().(traits.Lister).Add(other) }

func (l *jsonList) Iterator() traits.Iterator { return l.whole().(traits.Lister).Iterator() }

func (l *jsonList) ConvertToType(t ref.Type) ref.Val { return l.convert(l, t) }
