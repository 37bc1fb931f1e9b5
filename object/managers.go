package object

import (
	"slices"
	"strings"
	"time"
	"unique"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Who changed an object. An object's metadata.managedFields (server-side apply's field
// ownership) has an entry per field manager (kubectl, helm, a controller), operation (Apply,
// Update) and subresource: the fields it owns, and when it last changed them. The transforms cut
// managedFields (they are most of an object's bytes), so each object keeps a summary of them
// instead (Managers): per entry, hashes to tell whether it changed, and its description. A
// change's managers are the entries that changed from the old object's summary to the new one's
// (ChangedManagers).

// Managers is an object's summary of its managedFields (see ManagersOf): an entry per field
// manager, operation and subresource, in managedFields' order.
type Managers []manager

// manager is one entry of a summary: hashes of its key (manager, operation, subresource), of
// its stamp (apiVersion, time, fieldsType) and of its fields, its time, and its description
// but for the time. The description is the same for every object one manager changed the
// same fields of, and is kept once for all of them.
type manager struct {
	key           uint64
	stamp, fields uint32
	// unix is the entry's time, in seconds since the epoch, when desc.time is "".
	unix int64
	desc unique.Handle[description]
}

// description is an entry's JSON description, {"manager","operation","subresource" (only
// when set),"time","fields"}, in parts: fields are the top-level fields the entry owns (for
// metadata, the fields under it: metadata.labels).
type description struct {
	head string // {"manager":…,"operation":…[,"subresource":…]
	// time is the JSON string of the entry's time, or "" when it is a second in RFC 3339, UTC,
	// as the apiserver writes every time (see manager.unix).
	time string
	tail string // ,"fields":[…]}
}

// ManagersOf summarises managedFields, the JSON array of an object's metadata.managedFields as
// the apiserver sent it; nil when it holds no entry (or is not an array of objects).
func ManagersOf(managedFields []byte) Managers {
	arr := gjson.Parse(docOf(managedFields))
	if !arr.IsArray() {
		return nil
	}
	var entries [4]manager // room for most objects' entries, which are then copied exactly sized
	out := entries[:0]
	var names [16]string
	var head, tail, when [256]byte
	arr.ForEach(func(_, e gjson.Result) bool {
		if !e.IsObject() {
			return true
		}
		var name, operation, subresource, apiVersion, at, fieldsType string
		var fieldsV1 gjson.Result
		e.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "manager":
				name = v.Str
			case "operation":
				operation = v.Str
			case "subresource":
				subresource = v.Str
			case "apiVersion":
				apiVersion = v.Str
			case "time":
				at = v.Str
			case "fieldsType":
				fieldsType = v.Str
			case "fieldsV1":
				fieldsV1 = v
			}
			return true
		})
		// The description's parts are read from buffers on the stack: unique.Make copies the
		// strings of a value it keeps (a value not seen before) and keeps nothing of one it has,
		// so the parts of a description many objects share are not allocated for each.
		var d description
		b := append(head[:0], `{"manager":`...)
		b = AppendString(b, name)
		b = append(b, `,"operation":`...)
		b = AppendString(b, operation)
		if subresource != "" {
			b = append(b, `,"subresource":`...)
			b = AppendString(b, subresource)
		}
		d.head = unsafe.String(unsafe.SliceData(b), len(b))
		b = append(tail[:0], `,"fields":[`...)
		for i, n := range ownedFields(fieldsV1, names[:0]) {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendString(b, n)
		}
		b = append(b, "]}"...)
		d.tail = unsafe.String(unsafe.SliceData(b), len(b))
		unix, ok := secondOf(at)
		if !ok {
			b = AppendString(when[:0], at)
			d.time = unsafe.String(unsafe.SliceData(b), len(b))
		}
		out = append(out, manager{
			key:   hash64(name, operation, subresource),
			stamp: uint32(hash64(apiVersion, at, fieldsType)), fields: uint32(hash64(fieldsV1.Raw)),
			unix: unix, desc: unique.Make(d),
		})
		return true
	})
	if len(out) == 0 {
		return nil
	}
	return append(make(Managers, 0, len(out)), out...)
}

// secondOf reads t as a second in RFC 3339, UTC ("2026-11-28T10:00:00Z"), as the apiserver
// writes managedFields' times: false for any other form, which is kept as it is.
func secondOf(t string) (int64, bool) {
	const second = "2006-01-02T15:04:05Z"
	if len(t) != len(second) || t[len(t)-1] != 'Z' {
		return 0, false // not parsed: a failed parse allocates its error
	}
	at, err := time.Parse(time.RFC3339, t)
	if err != nil {
		return 0, false
	}
	var b [len(second)]byte
	if string(at.UTC().AppendFormat(b[:0], time.RFC3339)) != t {
		return 0, false
	}
	return at.Unix(), true
}

// appendTime appends the JSON string of m's time.
func (m manager) appendTime(out []byte) []byte {
	if d := m.desc.Value(); d.time != "" {
		return append(out, d.time...)
	}
	out = append(out, '"')
	out = time.Unix(m.unix, 0).UTC().AppendFormat(out, time.RFC3339)
	return append(out, '"')
}

// appendDescription appends m's description.
func (m manager) appendDescription(out []byte) []byte {
	d := m.desc.Value()
	out = append(out, d.head...)
	out = append(out, `,"time":`...)
	out = m.appendTime(out)
	return append(out, d.tail...)
}

// ownedFields appends to names the top-level fields fieldsV1 owns, and for metadata the fields
// under it (metadata.labels), sorted and without repeats.
func ownedFields(fieldsV1 gjson.Result, names []string) []string {
	fieldsV1.ForEach(func(k, v gjson.Result) bool {
		name, ok := strings.CutPrefix(k.Str, "f:")
		if !ok {
			return true
		}
		if name != "metadata" || !v.IsObject() {
			names = append(names, name)
			return true
		}
		under := false
		v.ForEach(func(k, _ gjson.Result) bool {
			if sub, ok := strings.CutPrefix(k.Str, "f:"); ok {
				names, under = append(names, "metadata."+sub), true
			}
			return true
		})
		if !under {
			names = append(names, name)
		}
		return true
	})
	slices.Sort(names)
	return slices.Compact(names)
}

// hash64 is FNV-1a over parts, each followed by a zero byte.
func hash64(parts ...string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, p := range parts {
		for i := 0; i < len(p); i++ {
			h = (h ^ uint64(p[i])) * prime
		}
		h *= prime // a zero byte
	}
	return h
}

// ChangedManagers is the JSON array of the descriptions (see ManagersOf) of cur's managedFields
// entries that changed at cur's version, since old (nil for an object new to the cache): an
// entry new since old, or whose stamp changed (its apiVersion, or its time: the apiserver moves
// it when the manager adds, changes or removes a field of its own), or, when no entry did, every
// entry whose fields changed (the same manager changing its fields twice within the second its
// time is kept to). Without old, every entry; without old's summary (an object resumed from the
// state store, which keeps none), the entries of the latest time. It is nil when cur has no
// summary: who changed it is not known. It may be [] when nothing tells: a change by a manager
// whose entry is the same as before (the same fields, within the same second), or a delete,
// which managedFields do not record.
func ChangedManagers(old, cur *Object) []byte {
	if cur == nil || cur.managers == nil {
		return nil
	}
	now := cur.managers
	var changed []manager
	switch {
	case old == nil:
		changed = now
	case old.managers == nil:
		changed = latest(now)
	default:
		before := map[uint64]manager{}
		for _, m := range old.managers {
			before[m.key] = m
		}
		for _, m := range now {
			if b, ok := before[m.key]; !ok || b.stamp != m.stamp {
				changed = append(changed, m)
			}
		}
		if len(changed) == 0 {
			for _, m := range now {
				if b := before[m.key]; b.fields != m.fields {
					changed = append(changed, m)
				}
			}
		}
	}
	out := []byte{'['}
	for i, m := range changed {
		if i > 0 {
			out = append(out, ',')
		}
		out = m.appendDescription(out)
	}
	return append(out, ']')
}

// latest are the entries of ms with the latest time (RFC 3339 times of one form compare as
// strings).
func latest(ms []manager) []manager {
	var out []manager
	newest := ""
	for _, m := range ms {
		switch t := gjson.ParseBytes(m.appendTime(nil)).Str; {
		case t > newest:
			newest, out = t, append(out[:0], m)
		case t == newest:
			out = append(out, m)
		}
	}
	return out
}

// PrimaryManager is the manager named first among changed (a JSON array ChangedManagers
// returned) with the latest time: the CloudEvents extension attribute fieldmanager. "" when
// changed names none.
func PrimaryManager(changed []byte) string {
	name, newest := "", ""
	gjson.ParseBytes(changed).ForEach(func(_, m gjson.Result) bool {
		if t := m.Get("time").Str; name == "" || t > newest {
			name, newest = m.Get("manager").Str, t
		}
		return true
	})
	return name
}
