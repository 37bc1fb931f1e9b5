package journal

import (
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
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/journal/wal"
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

// legacyFormat is the bbolt store's last format. 2 added the entries' revision; 3 names
// resources as object.ResourceName does, where 2 wrote schema.GroupVersionResource's String; 4
// added the entries' filter error; 5 the sinks bucket; 6 the entries' since (see Entry.Since).
// A store of an earlier format (1 has no meta bucket) is brought to 6 in a transaction that is
// read and rolled back: the file is left as it was.
const legacyFormat = "6"

// conversion is what convertLegacy did.
type conversion struct {
	noSinkRecords bool   // the store was of a format before 5
	setAside      string // where the converted file was moved
	damaged       string // where a damaged file was moved instead
	damageErr     error
}

// convertLegacy converts the bbolt store at path, written by an earlier release, to a log in
// its place: every outbox entry (with its sequence and deadline), every sink's replay record
// and every object's state go into the log's first snapshot. The file is set aside (renamed
// path.bbolt-<time>) only once the snapshot is synced, and the log moved into its place after;
// finishConversion completes a conversion stopped between the two. A file that bbolt cannot
// open, or whose pages cannot all be read, is set aside as damaged (path.damaged-<time>), and
// the log begins empty: every object is delivered again, with its usual event id.
func convertLegacy(path string) (conversion, error) {
	var c conversion
	db, err := openChecked(path)
	if errors.Is(err, errLocked) {
		return c, err
	}
	stamp := time.Now().UTC().Format("20060102T150405.000Z")
	if err != nil {
		c.damaged, c.damageErr = path+".damaged-"+stamp, err
		if rerr := os.Rename(path, c.damaged); rerr != nil {
			return c, fmt.Errorf("damaged and cannot be set aside: %w", errors.Join(err, rerr))
		}
		return c, nil
	}
	tmp := path + ".converting"
	err = os.RemoveAll(tmp) // what a conversion cut short left
	if err == nil {
		err = convertTo(db, tmp, &c)
	}
	if err = errors.Join(err, db.Close()); err != nil {
		return c, errors.Join(err, os.RemoveAll(tmp))
	}
	c.setAside = path + ".bbolt-" + stamp
	if err := os.Rename(path, c.setAside); err != nil {
		return c, errors.Join(err, os.RemoveAll(tmp))
	}
	if err := os.Rename(tmp, path); err != nil {
		return c, err
	}
	return c, syncDir(filepath.Dir(path))
}

// convertTo writes db's state, brought to legacyFormat in a transaction rolled back after, as
// the first snapshot of a new log in dir.
func convertTo(db *bolt.DB, dir string, c *conversion) error {
	tx, err := db.Begin(true)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // the file stays as it was
	was, err := upgrade(tx)
	if err != nil {
		return err
	}
	c.noSinkRecords = was != legacyFormat
	l, _, err := wal.Open(dir, wal.Options{}, func(wal.Pos, []byte) error { return nil })
	if err != nil {
		return err
	}
	err = l.WriteSnapshot(1, func(add func([]byte) (wal.Pos, error)) error { return writeLegacy(tx, add) })
	if err == nil {
		err = l.Compact(1)()
	}
	return errors.Join(err, l.Close())
}

// writeLegacy hands add the records of tx's state, a frame of about snapshotFrame at a time.
func writeLegacy(tx *bolt.Tx, add func([]byte) (wal.Pos, error)) error {
	buf := append([]byte{recFormat}, appendString(nil, logFormat)...)
	flush := func(force bool) error {
		if len(buf) == 0 || !force && len(buf) < snapshotFrame {
			return nil
		}
		_, err := add(buf)
		buf = buf[:0]
		return err
	}
	var last uint64
	err := tx.Bucket(sinksBucket).ForEach(func(k, v []byte) error {
		buf = append(buf, recSinkRecord)
		buf = appendBytes(buf, k)
		buf = appendBytes(buf, v)
		return nil
	})
	if err == nil {
		err = tx.Bucket(outboxBucket).ForEachBucket(func(sink []byte) error {
			return tx.Bucket(outboxBucket).Bucket(sink).ForEach(func(k, v []byte) error {
				if len(k) != 8 {
					return nil // not an entry: there is nothing to deliver
				}
				seq := binary.BigEndian.Uint64(k)
				last = max(last, seq)
				buf = append(buf, recEntry)
				buf = appendBytes(buf, sink)
				buf = binary.AppendUvarint(buf, seq)
				buf = appendBytes(buf, v)
				return flush(false)
			})
		})
	}
	if err == nil {
		err = tx.Bucket(objectsBucket).ForEachBucket(func(res []byte) error {
			return tx.Bucket(objectsBucket).Bucket(res).ForEach(func(k, v []byte) error {
				uid, rest, err := readString(v)
				var rv string
				if err == nil {
					rv, rest, err = readString(rest)
				}
				if err != nil {
					return nil // unreadable: the object is derived again from the cache
				}
				buf = append(buf, recObject)
				buf = appendBytes(buf, res)
				buf = appendBytes(buf, k)
				buf = appendString(buf, uid)
				buf = appendString(buf, rv)
				buf = appendBytes(buf, rest)
				return flush(false)
			})
		})
	}
	if err != nil {
		return err
	}
	buf = append(buf, recSeq)
	buf = binary.AppendUvarint(buf, last)
	return flush(true)
}

// finishConversion completes a conversion that stopped once the bbolt file was set aside and
// before the log was moved into its place; it removes the log of one that stopped before.
func finishConversion(path string) error {
	tmp := path + ".converting"
	if _, err := os.Stat(tmp); err != nil {
		return nil
	}
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return os.Rename(tmp, path)
	}
	if err == nil && fi.IsDir() {
		return os.RemoveAll(tmp)
	}
	return err // a file: convertLegacy converts it again
}

// syncDir makes a directory's entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
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

// upgrade creates the store's buckets and converts a store of an earlier format to this one.
// It returns the format the store was in.
func upgrade(tx *bolt.Tx) (string, error) {
	was := legacyFormat // a new store
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
	if was != legacyFormat {
		return found, fmt.Errorf("the store's format %q is not one this dynwatch reads (%s or earlier): it was written by a later release", was, legacyFormat)
	}
	return found, tx.Bucket(metaBucket).Put(formatKey, []byte(legacyFormat))
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
