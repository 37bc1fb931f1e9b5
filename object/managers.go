package object

import (
	"hash/maphash"
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
// the apiserver sent it; nil when it holds no entry (or is not an array of objects). It reads
// the array in place, in one pass (the hash of each entry's fields reads them again).
func ManagersOf(managedFields []byte) Managers {
	doc := managedFields
	i := SkipSpace(doc, 0)
	if i >= len(doc) || doc[i] != '[' {
		return nil
	}
	var entries [4]manager // room for most objects' entries, which are then copied exactly sized
	out := entries[:0]
	var s scratch
	for i = SkipSpace(doc, i+1); i < len(doc) && doc[i] != ']'; {
		end := 0
		if doc[i] == '{' {
			var m manager
			m, end = s.managerOf(doc, i)
			out = append(out, m)
		} else if end = skipValue(doc, i); end == i {
			break // not JSON: a byte that starts no value
		}
		if i = SkipSpace(doc, end); i < len(doc) && doc[i] == ',' {
			i = SkipSpace(doc, i+1)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return append(make(Managers, 0, len(out)), out...)
}

// scratch holds what a summary's entries are read into, on the stack of ManagersOf: the
// description's parts are read from its buffers, and unique.Make copies the strings of a value
// it keeps (a value not seen before) and keeps nothing of one it has, so the parts of a
// description many objects share are not allocated for each.
type scratch struct {
	names            [16]string
	head, tail, when [256]byte
}

// managerOf is the entry of managedFields whose JSON object is at doc[open:], and the object's
// end.
func (s *scratch) managerOf(doc []byte, open int) (manager, int) {
	var name, operation, subresource, apiVersion, at, fieldsType string
	var fieldsV1 []byte
	names := s.names[:0]
	members := scanMembers(doc, open)
	for {
		key, value, ok := members.next()
		if !ok {
			break
		}
		end := 0
		switch key {
		case "fieldsV1":
			names, end = ownedFields(doc, value, names[:0])
			fieldsV1 = doc[value:end]
		default:
			var v string
			v, end = stringValue(doc, value)
			switch key {
			case "manager":
				name = v
			case "operation":
				operation = v
			case "subresource":
				subresource = v
			case "apiVersion":
				apiVersion = v
			case "time":
				at = v
			case "fieldsType":
				fieldsType = v
			}
		}
		members.passed(end)
	}
	var d description
	b := append(s.head[:0], `{"manager":`...)
	b = AppendString(b, name)
	b = append(b, `,"operation":`...)
	b = AppendString(b, operation)
	if subresource != "" {
		b = append(b, `,"subresource":`...)
		b = AppendString(b, subresource)
	}
	d.head = unsafe.String(unsafe.SliceData(b), len(b))
	b = append(s.tail[:0], `,"fields":[`...)
	slices.Sort(names)
	for i, n := range slices.Compact(names) {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendString(b, n)
	}
	b = append(b, "]}"...)
	d.tail = unsafe.String(unsafe.SliceData(b), len(b))
	unix, ok := secondOf(at)
	if !ok {
		b = AppendString(s.when[:0], at)
		d.time = unsafe.String(unsafe.SliceData(b), len(b))
	}
	return manager{
		key:   hash64(name, operation, subresource),
		stamp: uint32(hash64(apiVersion, at, fieldsType)), fields: uint32(hash64(docOf(fieldsV1))),
		unix: unix, desc: unique.Make(d),
	}, members.end()
}

// secondOf reads t as a second in RFC 3339, UTC ("2026-11-28T10:00:00Z"), as the apiserver
// writes managedFields' times: false for any other form, which is kept as it is. It reads the
// digits itself: time.Parse and the format to check its result were a tenth of a summary's
// cost.
func secondOf(t string) (int64, bool) {
	const second = "2006-01-02T15:04:05Z"
	if len(t) != len(second) || t[4] != '-' || t[7] != '-' || t[10] != 'T' || t[13] != ':' || t[16] != ':' || t[19] != 'Z' {
		return 0, false
	}
	var n [6]int // year, month, day, hour, minute, second
	for i, f := range [6][2]int{{0, 4}, {5, 7}, {8, 10}, {11, 13}, {14, 16}, {17, 19}} {
		for _, c := range []byte(t[f[0]:f[1]]) {
			if c < '0' || c > '9' {
				return 0, false
			}
			n[i] = n[i]*10 + int(c-'0')
		}
	}
	if n[1] < 1 || n[1] > 12 || n[3] > 23 || n[4] > 59 || n[5] > 59 {
		return 0, false
	}
	at := time.Date(n[0], time.Month(n[1]), n[2], n[3], n[4], n[5], 0, time.UTC)
	if at.Day() != n[2] { // a day the month does not have, which time.Date would move on
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

// ownedFields appends to names the top-level fields that fieldsV1, the value of an entry at
// doc[value:], owns (none unless it is an object), and for metadata the fields under it
// (metadata.labels); and returns the value's end.
func ownedFields(doc []byte, value int, names []string) ([]string, int) {
	if value >= len(doc) || doc[value] != '{' {
		return names, skipValue(doc, value)
	}
	fields := scanMembers(doc, value)
	for {
		key, v, ok := fields.next()
		if !ok {
			break
		}
		name, owned := strings.CutPrefix(key, "f:")
		if !owned || name != "metadata" || v >= len(doc) || doc[v] != '{' {
			if owned {
				names = append(names, name)
			}
			fields.passed(skipValue(doc, v))
			continue
		}
		n := len(names)
		under := scanMembers(doc, v)
		for {
			sub, w, ok := under.next()
			if !ok {
				break
			}
			if sub, ok := strings.CutPrefix(sub, "f:"); ok {
				names = append(names, "metadata."+sub)
			}
			under.passed(skipValue(doc, w))
		}
		if len(names) == n {
			names = append(names, name)
		}
		fields.passed(under.end())
	}
	return names, fields.end()
}

// hashSeed is the seed of every summary's hashes: they are compared only with the hashes of
// other summaries of the same process.
var hashSeed = maphash.MakeSeed()

// hash64 is a hash of parts, each followed by a zero byte.
func hash64(parts ...string) uint64 {
	var h maphash.Hash
	h.SetSeed(hashSeed)
	for _, p := range parts {
		_, _ = h.WriteString(p) // never fails
		_ = h.WriteByte(0)
	}
	return h.Sum64()
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
