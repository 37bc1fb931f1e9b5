package object

import (
	"encoding/binary"
	"slices"
	"strings"

	"github.com/tidwall/gjson"
)

// Who changed an object. An object's metadata.managedFields (server-side apply's field
// ownership) has an entry per field manager (kubectl, helm, a controller), operation (Apply,
// Update) and subresource: the fields it owns, and when it last changed them. The transforms cut
// managedFields (they are most of an object's bytes), so each object keeps a summary of them
// instead (Managers): per entry, hashes to tell whether it changed, and its description. A
// change's managers are the entries that changed from the old object's summary to the new one's
// (ChangedManagers).

// ManagersOf summarises managedFields, the JSON array of an object's metadata.managedFields as
// the apiserver sent it; nil when it holds no entry (or is not an array of objects). For each
// entry it keeps, in one allocation of its exact size: a hash of its key (manager, operation, subresource), of its
// stamp (apiVersion, time, fieldsType) and of its fields, and its description, the JSON
// {"manager","operation","subresource" (only when set),"time","fields"}, where fields are the
// top-level fields the entry owns (for metadata, the fields under it: metadata.labels).
func ManagersOf(managedFields []byte) []byte {
	arr := gjson.Parse(docOf(managedFields))
	if !arr.IsArray() {
		return nil
	}
	var stack [1024]byte // room for most objects' summaries, which are then copied exactly sized
	out := stack[:0]
	var names [16]string
	arr.ForEach(func(_, e gjson.Result) bool {
		if !e.IsObject() {
			return true
		}
		var manager, operation, subresource, apiVersion, time, fieldsType string
		var fieldsV1 gjson.Result
		e.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "manager":
				manager = v.Str
			case "operation":
				operation = v.Str
			case "subresource":
				subresource = v.Str
			case "apiVersion":
				apiVersion = v.Str
			case "time":
				time = v.Str
			case "fieldsType":
				fieldsType = v.Str
			case "fieldsV1":
				fieldsV1 = v
			}
			return true
		})
		out = binary.BigEndian.AppendUint64(out, hash64(manager, operation, subresource))
		out = binary.BigEndian.AppendUint32(out, uint32(hash64(apiVersion, time, fieldsType)))
		out = binary.BigEndian.AppendUint32(out, uint32(hash64(fieldsV1.Raw)))
		at := len(out)
		out = append(out, 0, 0) // the description's length, two bytes
		out = append(out, `{"manager":`...)
		out = AppendString(out, manager)
		out = append(out, `,"operation":`...)
		out = AppendString(out, operation)
		if subresource != "" {
			out = append(out, `,"subresource":`...)
			out = AppendString(out, subresource)
		}
		out = append(out, `,"time":`...)
		out = AppendString(out, time)
		out = append(out, `,"fields":[`...)
		for i, n := range ownedFields(fieldsV1, names[:0]) {
			if i > 0 {
				out = append(out, ',')
			}
			out = AppendString(out, n)
		}
		out = append(out, "]}"...)
		n := len(out) - at - 2
		if n > 0xffff {
			out = out[:at-16] // a description past 64 KiB: the entry is left out
			return true
		}
		binary.BigEndian.PutUint16(out[at:], uint16(n))
		return true
	})
	if len(out) == 0 {
		return nil
	}
	return append(make([]byte, 0, len(out)), out...)
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

// manager is one entry of a summary (see ManagersOf).
type manager struct {
	key           uint64
	stamp, fields uint32
	desc          []byte
}

// managers reads a summary; each desc aliases it.
func managers(sum []byte) []manager {
	var out []manager
	for len(sum) >= 16 {
		m := manager{key: binary.BigEndian.Uint64(sum), stamp: binary.BigEndian.Uint32(sum[8:]), fields: binary.BigEndian.Uint32(sum[12:])}
		if len(sum) < 18 {
			return out
		}
		n := int(binary.BigEndian.Uint16(sum[16:]))
		if len(sum)-18 < n {
			return out
		}
		m.desc = sum[18 : 18+n]
		sum = sum[18+n:]
		out = append(out, m)
	}
	return out
}

// Managers is the object's summary of its managedFields (see ManagersOf); nil when it came in
// without managedFields or from where they are not kept (a state store, see ChangedManagers).
func (o *Object) Managers() []byte { return o.managers }

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
	now := managers(cur.managers)
	var changed []manager
	switch {
	case old == nil:
		changed = now
	case old.managers == nil:
		changed = latest(now)
	default:
		before := map[uint64]manager{}
		for _, m := range managers(old.managers) {
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
		out = append(out, m.desc...)
	}
	return append(out, ']')
}

// latest are the entries of ms with the latest time (RFC 3339 times of one form compare as
// strings).
func latest(ms []manager) []manager {
	var out []manager
	newest := ""
	for _, m := range ms {
		switch t := gjson.GetBytes(m.desc, "time").Str; {
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
