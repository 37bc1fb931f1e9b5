package journal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/dynwatch/dynwatch/dynamicinformer"
	"github.com/dynwatch/dynwatch/object"
)

// The store's layout: objects/<resource name>/<key> → stored object, outbox/<sink>/<sequence>
// → outbox entry, sinks/<sink> → where its initialState replay stands (see replayRecord), and
// meta/format → the store's format. Resource names, keys and ordering keys are package
// object's. Sequences are big-endian, so a cursor walks an outbox oldest first.
var (
	objectsBucket = []byte("objects")
	outboxBucket  = []byte("outbox")
	sinksBucket   = []byte("sinks")
	metaBucket    = []byte("meta")
	formatKey     = []byte("format")
)

// format is the store's format. 2 added the entries' revision; 3 names resources as
// object.ResourceName does, where 2 wrote schema.GroupVersionResource's String; 4 added the
// entries' filter error; 5 the sinks bucket; 6 the entries' since (see Entry.Since). A store
// of an earlier format (1 has no meta bucket) is converted when it is opened, in one
// transaction.
const format = "6"

// store is the journal's file, a bbolt database: per resource the last state of every object
// handed to the sinks, and per sink the outbox of events neither delivered nor dead-lettered
// (nor acknowledged by a checkpoint). Only the Journal writes it, one transaction per batch.
type store struct {
	db *bolt.DB
	// Path is the file.
	Path string
	// Fresh is true when there is no earlier state to compare with: the file did not exist,
	// or it was damaged and set aside.
	Fresh bool
	// Damaged, when set, is where a damaged file was moved, and DamageErr what was wrong.
	Damaged   string
	DamageErr error
	// NoSinkRecords is true when the store was of a format before 5, which kept no record of
	// the sinks it had seen.
	NoSinkRecords bool
}

// errLocked is another process holding the store.
var errLocked = errors.New("another process has the store open")

// openStore opens or creates the store at path, and its directory. It fails at once if another
// process holds it. A file that bbolt cannot open, or whose pages cannot all be read, is set
// aside (renamed path.damaged-<time>) and replaced by an empty store: dynwatch then replays
// every object, with the same event ids, rather than crash-looping on its own file.
func openStore(path string) (*store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("state.path %s: %w", path, err)
	}
	_, err := os.Stat(path)
	s := &store{Path: path, Fresh: errors.Is(err, os.ErrNotExist)}
	s.db, err = openChecked(path)
	if err != nil && !s.Fresh && !errors.Is(err, errLocked) {
		s.Damaged, s.DamageErr = fmt.Sprintf("%s.damaged-%s", path, time.Now().UTC().Format("20060102T150405.000Z")), err
		if rerr := os.Rename(path, s.Damaged); rerr != nil {
			return nil, fmt.Errorf("state.path %s is damaged and cannot be set aside: %w", path, errors.Join(err, rerr))
		}
		s.Fresh = true
		s.db, err = openChecked(path)
	}
	if err != nil {
		return nil, fmt.Errorf("state.path %s: %w", path, err)
	}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		was, err := upgrade(tx)
		s.NoSinkRecords = was != format
		return err
	}); err != nil {
		return nil, fmt.Errorf("state.path %s: %w", path, errors.Join(err, s.db.Close()))
	}
	return s, nil
}

// openChecked checks the bbolt file at path, if there is one, and opens it for writing.
func openChecked(path string) (*bolt.DB, error) {
	if err := check(path); err != nil {
		return nil, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, errLocked
	}
	return db, err
}

// check opens the file read-only and reads every page reachable from its root. On a damaged
// file bbolt panics or faults on its memory map; here, in this goroutine, both become an error,
// where the read-write open (which walks the pages from a goroutine of its own to rebuild the
// free list) would crash the process.
func check(path string) (err error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("damaged: %v", r)
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return errLocked
	}
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }() // read-only: nothing to lose
	if err := db.View(func(tx *bolt.Tx) error { return walk(tx.Cursor(), 0) }); err != nil {
		return fmt.Errorf("damaged: %w", err)
	}
	return nil
}

// walk visits every key of a bucket and of its nested buckets.
func walk(c *bolt.Cursor, depth int) error {
	if depth > 3 {
		return errors.New("buckets nested deeper than the store's layout")
	}
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if v == nil {
			if b := c.Bucket().Bucket(k); b != nil {
				if err := walk(b.Cursor(), depth+1); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// release drops the file's pages from the process's resident memory. bbolt reads the file
// through a memory map, and every page a read or a write touched stays mapped, so the whole
// file came to count as resident (193 MB for 20,000 configmaps after their initial deliveries)
// although the kernel may reclaim it at any time. The View holds bbolt's map lock, so the
// mapping cannot move while its pages are dropped.
func (s *store) release() error {
	return s.db.View(func(tx *bolt.Tx) error { return dropMapped(s.db.Info().Data, tx.Size()) })
}

// Close closes the file.
func (s *store) close() error { return s.db.Close() }

// Size is the size of the store's data in bytes.
func (s *store) size() int64 {
	var n int64
	_ = s.db.View(func(tx *bolt.Tx) error { n = tx.Size(); return nil })
	return n
}

// upgrade creates the store's buckets and converts a store of an earlier format to this one.
// It returns the format the store was in.
func upgrade(tx *bolt.Tx) (string, error) {
	was := format // a new store
	if meta := tx.Bucket(metaBucket); meta != nil {
		was = string(meta.Get(formatKey))
	} else if tx.Bucket(outboxBucket) != nil {
		was = "1"
	}
	found := was
	for _, b := range [][]byte{objectsBucket, outboxBucket, sinksBucket, metaBucket} {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			return found, err
		}
	}
	steps := []struct {
		from, to string
		convert  func(*bolt.Tx) error
	}{{"1", "2", addRevisions}, {"2", "3", renameResources}, {"3", "4", addFilterErrors}, {"4", "5", nil}, {"5", "6", addSince}}
	for _, st := range steps {
		if was == st.from {
			if st.convert != nil {
				if err := st.convert(tx); err != nil {
					return found, fmt.Errorf("convert the store from format %s to %s: %w", st.from, st.to, err)
				}
			}
			was = st.to
		}
	}
	if was != format {
		return found, fmt.Errorf("the store's format %q is not one this dynwatch reads (%s or earlier): it was written by a later release", was, format)
	}
	return found, tx.Bucket(metaBucket).Put(formatKey, []byte(format))
}

// addRevisions converts format 1 outbox entries, which had no revision, taking it from the
// event id (uid.resourceVersion.type).
func addRevisions(tx *bolt.Tx) error {
	return tx.Bucket(outboxBucket).ForEachBucket(func(name []byte) error {
		return rewriteEntries(tx.Bucket(outboxBucket).Bucket(name), func(v []byte) []byte {
			if len(v) < 3*8 {
				return nil // corrupt: removed when it is read
			}
			id, _, err := readString(v[3*8:])
			if err != nil {
				return nil
			}
			rev := uint64(0)
			if parts := strings.Split(id, "."); len(parts) == 3 {
				rev = object.Revision(parts[1])
			}
			nv := make([]byte, 0, len(v)+8)
			nv = append(nv, v[:3*8]...)
			nv = binary.BigEndian.AppendUint64(nv, rev)
			return append(nv, v[3*8:]...)
		})
	})
}

// addFilterErrors converts format 3 outbox entries, which had no filter error, giving each an
// empty one.
func addFilterErrors(tx *bolt.Tx) error {
	return tx.Bucket(outboxBucket).ForEachBucket(func(name []byte) error {
		return rewriteEntries(tx.Bucket(outboxBucket).Bucket(name), func(v []byte) []byte {
			if len(v) < formatFourHeader {
				return nil // corrupt: removed when it is read
			}
			_, rest, err := readString(v[formatFourHeader:])
			if err == nil {
				_, rest, err = readString(rest)
			}
			if err != nil {
				return nil
			}
			at := len(v) - len(rest) // after the id and the key
			nv := make([]byte, 0, len(v)+1)
			nv = append(nv, v[:at]...)
			nv = appendString(nv, "")
			return append(nv, rest...)
		})
	})
}

// addSince converts format 5 outbox entries, which had no since, giving each 0: its revision
// is exact.
func addSince(tx *bolt.Tx) error {
	return tx.Bucket(outboxBucket).ForEachBucket(func(name []byte) error {
		return rewriteEntries(tx.Bucket(outboxBucket).Bucket(name), func(v []byte) []byte {
			if len(v) < formatFourHeader {
				return nil // corrupt: removed when it is read
			}
			nv := make([]byte, 0, len(v)+8)
			nv = append(nv, v[:formatFourHeader]...)
			nv = binary.BigEndian.AppendUint64(nv, 0)
			return append(nv, v[formatFourHeader:]...)
		})
	})
}

// renameResources converts format 2's resource names (schema.GroupVersionResource's String,
// "apps/v1, Resource=deployments") to object.ResourceName's, in the objects buckets' names and
// in the outbox entries' ordering keys.
func renameResources(tx *bolt.Tx) error {
	objects := tx.Bucket(objectsBucket)
	var names [][]byte
	if err := objects.ForEachBucket(func(k []byte) error { names = append(names, append([]byte(nil), k...)); return nil }); err != nil {
		return err
	}
	for _, old := range names {
		gvr, ok := formatTwoResource(string(old))
		if !ok {
			continue // not format 2's: left as it is
		}
		if err := moveBucket(objects, old, resourceBucket(gvr)); err != nil {
			return fmt.Errorf("objects of %s: %w", old, err)
		}
	}
	return tx.Bucket(outboxBucket).ForEachBucket(func(sink []byte) error {
		return rewriteEntries(tx.Bucket(outboxBucket).Bucket(sink), func(v []byte) []byte {
			if len(v) < formatFourHeader {
				return nil // corrupt: counted and removed when it is read
			}
			id, rest, err := readString(v[formatFourHeader:])
			if err != nil {
				return nil
			}
			key, body, err := readString(rest)
			if err != nil {
				return nil
			}
			res, objKey, _ := strings.Cut(key, "|")
			gvr, ok := formatTwoResource(res)
			if !ok {
				return nil
			}
			ns, name := object.SplitKey(objKey)
			nv := appendString(append([]byte(nil), v[:formatFourHeader]...), id)
			nv = appendString(nv, object.OrderingKey(gvr, ns, name))
			return append(nv, body...)
		})
	})
}

// formatTwoResource parses schema.GroupVersionResource's String, as format 2 named resources.
func formatTwoResource(s string) (schema.GroupVersionResource, bool) {
	gv, res, ok := strings.Cut(s, ", Resource=")
	if !ok || res == "" {
		return schema.GroupVersionResource{}, false
	}
	v, err := schema.ParseGroupVersion(gv)
	if err != nil || v.Version == "" {
		return schema.GroupVersionResource{}, false
	}
	return v.WithResource(res), true
}

// moveBucket moves the keys and values of parent's bucket from into a bucket to, created if
// need be, and deletes from.
func moveBucket(parent *bolt.Bucket, from, to []byte) error {
	src := parent.Bucket(from)
	dst, err := parent.CreateBucketIfNotExists(to)
	if err != nil {
		return err
	}
	if err := src.ForEach(func(k, v []byte) error { return dst.Put(k, v) }); err != nil {
		return err
	}
	return parent.DeleteBucket(from)
}

// rewriteEntries replaces each value of b with what convert makes of it; nil leaves it as it
// is.
func rewriteEntries(b *bolt.Bucket, convert func(v []byte) []byte) error {
	type kv struct{ k, v []byte }
	var out []kv
	err := b.ForEach(func(k, v []byte) error {
		if nv := convert(v); nv != nil {
			out = append(out, kv{append([]byte(nil), k...), nv})
		}
		return nil
	})
	for _, e := range out {
		if err == nil {
			err = b.Put(e.k, e.v)
		}
	}
	return err
}

// outboxPage is a stretch of a sink's outbox, oldest first. Its entries' events carry their objects'
// names, uids and resourceVersions only; each entry's Body is its whole request.
type outboxPage struct {
	Entries []Entry
	Corrupt []uint64 // entries that do not decode
	Next    uint64   // the first sequence after those read
	End     bool     // nothing follows
}

// page reads up to limit entries of a sink's outbox from sequence from on.
func (s *store) page(sink string, from uint64, limit int) (outboxPage, error) {
	p := outboxPage{Next: from, End: true}
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(outboxBucket).Bucket([]byte(sink))
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.Seek(sequenceKey(from)); k != nil; k, v = c.Next() {
			if len(p.Entries) == limit {
				p.End = false
				return nil
			}
			seq := binary.BigEndian.Uint64(k)
			p.Next = seq + 1
			d, err := decodeEntry(v)
			if err != nil {
				p.Corrupt = append(p.Corrupt, seq)
				continue
			}
			d.Seq = seq
			p.Entries = append(p.Entries, d)
		}
		return nil
	})
	return p, err
}

// outboxIndex reads the revision and resource of every outbox entry, without their bodies.
func (s *store) outboxIndex() (map[string]map[uint64]indexed, error) {
	idx := map[string]map[uint64]indexed{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(outboxBucket).ForEachBucket(func(name []byte) error {
			m := map[uint64]indexed{}
			idx[string(name)] = m
			return tx.Bucket(outboxBucket).Bucket(name).ForEach(func(k, v []byte) error {
				m[binary.BigEndian.Uint64(k)] = indexEntry(v)
				return nil
			})
		})
	})
	return idx, err
}

// sinks lists the sinks that have an outbox.
func (s *store) sinks() ([]string, error) {
	var names []string
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(outboxBucket).ForEachBucket(func(k []byte) error {
			names = append(names, string(k))
			return nil
		})
	})
	return names, err
}

// lastSequence is the highest outbox sequence in use.
func (s *store) lastSequence() uint64 {
	var last uint64
	_ = s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(outboxBucket).ForEachBucket(func(name []byte) error {
			if k, _ := tx.Bucket(outboxBucket).Bucket(name).Cursor().Last(); k != nil {
				last = max(last, binary.BigEndian.Uint64(k))
			}
			return nil
		})
	})
	return last
}

// stored is an object as the store holds it: its uid and resourceVersion, and its JSON.
type stored struct {
	uid, rv string
	json    []byte
}

// storedObject encodes an object: uid and resourceVersion first, so that comparing them does not
// need the JSON decoded.
func storedObject(u *dynamicinformer.Object) []byte {
	uid, rv, objJSON := string(u.GetUID()), u.GetResourceVersion(), u.JSON()
	buf := make([]byte, 0, 2*binary.MaxVarintLen64+len(uid)+len(rv)+len(objJSON))
	buf = appendString(buf, uid)
	buf = appendString(buf, rv)
	return append(buf, objJSON...)
}

func decodeStored(v []byte) (stored, error) {
	var s stored
	var err error
	if s.uid, v, err = readString(v); err != nil {
		return s, err
	}
	if s.rv, v, err = readString(v); err != nil {
		return s, err
	}
	s.json = v
	return s, nil
}

// object is the stored object, its JSON copied out of the transaction.
func (s stored) object() (*dynamicinformer.Object, error) {
	u, err := dynamicinformer.ObjectFromJSON(bytes.Clone(s.json))
	if err != nil {
		return nil, fmt.Errorf("stored object: %w", err)
	}
	return u, nil
}

// An outbox entry: deadline, enqueued and observed times (unix nanoseconds), the revision, the
// since, the id, the ordering key and the filter error, then the request body, from which the
// event is restored. Formats 2 to 5 had no since.
const (
	entryHeader      = 5 * 8
	formatFourHeader = 4 * 8
)

func encodeEntry(d Entry) []byte {
	buf := make([]byte, entryHeader, entryHeader+3*binary.MaxVarintLen64+len(d.ID)+len(d.Key)+len(d.FilterError)+len(d.Body))
	binary.BigEndian.PutUint64(buf[0:], uint64(unixNano(d.Deadline)))
	binary.BigEndian.PutUint64(buf[8:], uint64(unixNano(d.Enqueued)))
	binary.BigEndian.PutUint64(buf[16:], uint64(unixNano(d.Event.Observed)))
	binary.BigEndian.PutUint64(buf[24:], d.Revision)
	binary.BigEndian.PutUint64(buf[32:], d.Since)
	buf = appendString(buf, d.ID)
	buf = appendString(buf, d.Key)
	buf = appendString(buf, d.FilterError)
	return append(buf, d.Body...)
}

// setEntryDeadline rewrites the deadline of an encoded entry.
func setEntryDeadline(v []byte, deadline time.Time) []byte {
	out := append([]byte(nil), v...)
	binary.BigEndian.PutUint64(out, uint64(unixNano(deadline)))
	return out
}

// indexed is what the journal keeps in memory of an outbox entry.
type indexed struct {
	resource schema.GroupVersionResource // from the ordering key
	revision uint64
	since    uint64
}

// lowest is the lowest revision the entry's change may have happened at (see Entry.Since).
func (x indexed) lowest() uint64 {
	if x.since != 0 {
		return x.since
	}
	return x.revision
}

// indexEntry reads an entry's index fields; a corrupt entry has neither.
func indexEntry(v []byte) indexed {
	if len(v) < entryHeader {
		return indexed{}
	}
	x := indexed{revision: binary.BigEndian.Uint64(v[24:]), since: binary.BigEndian.Uint64(v[32:])}
	if _, rest, err := readString(v[entryHeader:]); err == nil {
		if key, _, err := readString(rest); err == nil {
			x.resource, _ = object.OrderingKeyResource(key)
		}
	}
	return x
}

// resourceBucket is the name of a resource's bucket under objects.
func resourceBucket(gvr schema.GroupVersionResource) []byte {
	return []byte(object.ResourceName(gvr))
}

func decodeEntry(v []byte) (Entry, error) {
	if len(v) < entryHeader {
		return Entry{}, errors.New("truncated")
	}
	d := Entry{
		Deadline: fromUnixNano(int64(binary.BigEndian.Uint64(v[0:]))),
		Enqueued: fromUnixNano(int64(binary.BigEndian.Uint64(v[8:]))),
		Revision: binary.BigEndian.Uint64(v[24:]),
		Since:    binary.BigEndian.Uint64(v[32:]),
	}
	observed := fromUnixNano(int64(binary.BigEndian.Uint64(v[16:])))
	rest := v[entryHeader:]
	var err error
	if d.ID, rest, err = readString(rest); err != nil {
		return d, err
	}
	if d.Key, rest, err = readString(rest); err != nil {
		return d, err
	}
	if d.FilterError, rest, err = readString(rest); err != nil {
		return d, err
	}
	d.Body = append([]byte(nil), rest...)
	// The body is the request; of the event, only what names it is decoded: a queue refilled
	// from the outbox would otherwise hold every object twice, in the body and as the event's.
	var p struct {
		Type     dynamicinformer.EventType `json:"type"`
		Resource struct {
			Group    string `json:"group"`
			Version  string `json:"version"`
			Resource string `json:"resource"`
		} `json:"resource"`
		Object struct {
			Metadata struct {
				Name            string `json:"name"`
				Namespace       string `json:"namespace"`
				UID             string `json:"uid"`
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		} `json:"object"`
	}
	if err := utiljson.Unmarshal(d.Body, &p); err != nil {
		return d, fmt.Errorf("body: %w", err)
	}
	m := p.Object.Metadata
	meta := map[string]any{"name": m.Name, "uid": m.UID, "resourceVersion": m.ResourceVersion}
	if m.Namespace != "" {
		meta["namespace"] = m.Namespace
	}
	d.Event = dynamicinformer.Event{
		Type:     p.Type,
		Resource: schema.GroupVersionResource{Group: p.Resource.Group, Version: p.Resource.Version, Resource: p.Resource.Resource},
		Object:   dynamicinformer.NewObject(&unstructured.Unstructured{Object: map[string]any{"metadata": meta}}),
		Observed: observed,
		Revision: d.Revision,
		Since:    d.Since,
	}
	return d, nil
}

func sequenceKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

func appendString(buf []byte, s string) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

func readString(v []byte) (string, []byte, error) {
	n, size := binary.Uvarint(v)
	if size <= 0 || uint64(len(v)-size) < n {
		return "", nil, errors.New("truncated")
	}
	return string(v[size : size+int(n)]), v[size+int(n):], nil
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func sameObject(s stored, u *dynamicinformer.Object) bool {
	return types.UID(s.uid) == u.GetUID() && s.rv == u.GetResourceVersion()
}
