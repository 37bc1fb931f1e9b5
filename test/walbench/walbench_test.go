//go:build linux

package walbench

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/cockroachdb/pebble/v2/record"
	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/dynwatch/dynwatch/journal/wal"
)

const (
	recordsPerCommit = 8
	minRecord        = 1792 // a record has minRecord to minRecord+recordSpread-1 bytes
	recordSpread     = 512
)

// workload is the records of a run of commits: record seq is the same bytes in every
// candidate and every run.
type workload struct {
	pool   []byte
	window uint64 // how many of the newest records are not yet acknowledged
	// walCompactAt is the wal's segments' size at which it snapshots the live records: four
	// windows' bytes.
	walCompactAt int64
}

func newWorkload(window uint64) *workload {
	r := rand.New(rand.NewPCG(1, 2))
	pool := make([]byte, 1<<20)
	for i := 0; i < len(pool); i += 8 {
		binary.LittleEndian.PutUint64(pool[i:], r.Uint64())
	}
	return &workload{pool: pool, window: window, walCompactAt: 4 * int64(window) * (minRecord + recordSpread/2)}
}

// record is record seq's bytes.
func (w *workload) record(seq uint64) []byte {
	n := minRecord + int(seq*7919%recordSpread)
	off := int(seq * 104729 % uint64(len(w.pool)-minRecord-recordSpread))
	return w.pool[off : off+n]
}

// commit makes commit i of the run: its records, and every record below ackBelow
// acknowledged.
func (w *workload) commit(i int, recs [][]byte) (first uint64, _ [][]byte, ackBelow uint64) {
	first = uint64(i) * recordsPerCommit
	recs = recs[:0]
	for seq := first; seq < first+recordsPerCommit; seq++ {
		recs = append(recs, w.record(seq))
	}
	next := first + recordsPerCommit
	return first, recs, next - min(next, w.window)
}

// log is a candidate opened on a directory.
type log interface {
	// commit makes recs (sequence numbers first, first+1, ...) durable, and with them the
	// acknowledgement of every record below ackBelow, which it may then remove.
	commit(first uint64, recs [][]byte, ackBelow uint64) error
	close() error
}

// held is what a candidate holds once reopened: its live records, first to last, and the
// last one's bytes.
type held struct {
	first, last uint64
	lastRecord  []byte
}

type candidate struct {
	name string
	open func(dir string, w *workload) (log, error)
	held func(dir string) (held, error)
	// lag is how many acknowledged records the candidate may still hold: it removes them in
	// batches.
	lag uint64
}

var candidates = []candidate{
	{name: "wal", open: openWAL, held: heldWAL},
	{name: "bbolt", open: openBolt, held: heldBolt},
	{name: "raftwal", open: openRaftWAL(1), held: heldRaftWAL},
	{name: "raftwal-trim64", open: openRaftWAL(64), held: heldRaftWAL, lag: 64 * recordsPerCommit},
	{name: "pebble-record", open: openPebble, held: heldPebble},
}

// run makes commits commits of w to l.
func run(l log, w *workload, commits int) error {
	recs := make([][]byte, 0, recordsPerCommit)
	for i := range commits {
		first, recs, ackBelow := w.commit(i, recs)
		if err := l.commit(first, recs, ackBelow); err != nil {
			return fmt.Errorf("commit %d: %w", i, err)
		}
	}
	return nil
}

// checkHeld checks that c, reopened on dir after commits commits of w, holds their last
// window of records.
func checkHeld(c candidate, dir string, w *workload, commits int) error {
	h, err := c.held(dir)
	if err != nil {
		return fmt.Errorf("reopen: %w", err)
	}
	next := uint64(commits) * recordsPerCommit
	firstLive := next - min(next, w.window)
	if h.last != next-1 || h.first > firstLive || h.first+c.lag < firstLive {
		return fmt.Errorf("holds records %d to %d; want %d (or up to %d earlier) to %d", h.first, h.last, firstLive, c.lag, next-1)
	}
	if !bytes.Equal(h.lastRecord, w.record(h.last)) {
		return fmt.Errorf("record %d differs from the one committed", h.last)
	}
	return nil
}

func TestEveryCandidateHoldsTheLastWindowOfRecordsOnceReopened(t *testing.T) {
	const commits = 150
	w := newWorkload(64) // small, so that the wal compacts several times
	type test struct {
		name string
		c    candidate
		w    *workload
	}
	var tests []test
	for _, c := range candidates {
		tests = append(tests, test{c.name, c, w})
	}
	// The window's records are acknowledged long before the next compaction, so that one
	// lost by a snapshot would be missed: a wal that compacts at every commit ends on one.
	eager := *w
	eager.walCompactAt = 1
	tests = append(tests, test{"wal compacting at every commit", candidates[0], &eager})
	for _, tt := range tests {
		c, w := tt.c, tt.w
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			l, err := c.open(dir, w)
			if err != nil {
				t.Fatal(err)
			}
			err = run(l, w, commits)
			if err = errors.Join(err, l.close()); err != nil {
				t.Fatal(err)
			}
			if err := checkHeld(c, dir, w, commits); err != nil {
				t.Error(err)
			}
		})
	}
}

func BenchmarkCommit(b *testing.B) {
	w := newWorkload(256)
	for _, c := range candidates {
		b.Run(c.name, func(b *testing.B) {
			dir := b.TempDir()
			l, err := c.open(dir, w)
			if err != nil {
				b.Fatal(err)
			}
			recs := make([][]byte, 0, recordsPerCommit)
			io0 := readProcIO(b)
			commits := 0
			for b.Loop() {
				first, recs, ackBelow := w.commit(commits, recs)
				if err := l.commit(first, recs, ackBelow); err != nil {
					b.Fatalf("commit %d: %v", commits, err)
				}
				commits++
			}
			io1 := readProcIO(b)
			records := float64(commits * recordsPerCommit)
			b.ReportMetric(float64(io1.wchar-io0.wchar)/records, "wchar-B/record")
			b.ReportMetric(float64(io1.writeBytes-io0.writeBytes)/records, "disk-write-B/record")
			b.ReportMetric(float64(dirKiB(b, dir)), "dir-KiB")
			b.ReportMetric(float64(pageCacheKiB(b, dir)), "page-cache-KiB")
			b.ReportMetric(float64(mappedKiB(b, dir)), "mapped-KiB")
			if err := l.close(); err != nil {
				b.Fatal(err)
			}
			if err := checkHeld(c, dir, w, commits); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// A batch is how wal and pebble-record hold a commit, and wal a snapshot's record:
// [ackBelow u64][count u32], then per record [seq u64][len u32][bytes].
const (
	batchHeader  = 12
	recordHeader = 12
)

// appendBatch appends the batch of recs to buf, and the offset of each record's bytes in it
// to offs.
func appendBatch(buf []byte, ackBelow, first uint64, recs [][]byte, offs []int) ([]byte, []int) {
	buf = binary.LittleEndian.AppendUint64(buf, ackBelow)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(recs)))
	for i, r := range recs {
		buf = binary.LittleEndian.AppendUint64(buf, first+uint64(i))
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(r)))
		offs = append(offs, len(buf))
		buf = append(buf, r...)
	}
	return buf, offs
}

// heldBatches gathers what a candidate's batches hold: the greatest acknowledgement, the
// records seen, and the last one.
type heldBatches struct {
	held
	acked uint64
	seen  map[uint64]bool
}

func (h *heldBatches) add(b []byte) error {
	if len(b) < batchHeader {
		return errors.New("a batch cut short")
	}
	h.acked = max(h.acked, binary.LittleEndian.Uint64(b))
	n := binary.LittleEndian.Uint32(b[8:])
	b = b[batchHeader:]
	for range n {
		if len(b) < recordHeader {
			return errors.New("a batch's record cut short")
		}
		seq, size := binary.LittleEndian.Uint64(b), int(binary.LittleEndian.Uint32(b[8:]))
		if len(b) < recordHeader+size {
			return errors.New("a batch's record cut short")
		}
		if len(h.seen) == 0 || seq > h.last {
			h.last, h.lastRecord = seq, bytes.Clone(b[recordHeader:recordHeader+size])
		}
		if h.seen == nil {
			h.seen = map[uint64]bool{}
		}
		h.seen[seq] = true
		b = b[recordHeader+size:]
	}
	return nil
}

// result is what the batches hold live: every record from the greatest acknowledgement on.
func (h *heldBatches) result() (held, error) {
	for seq := h.acked; seq <= h.last; seq++ {
		if !h.seen[seq] {
			return held{}, fmt.Errorf("record %d, not acknowledged, is missing", seq)
		}
	}
	h.first = h.acked
	return h.held, nil
}

// walLog is journal/wal as the journal would use it.
type walLog struct {
	l         *wal.Log
	live      []liveRecord // the records not acknowledged, in order
	compactAt int64        // the segments' size at which the live records are snapshotted
	ackBelow  uint64
	buf       []byte
	offs      []int
}

type liveRecord struct {
	seq uint64
	at  wal.Pos
	n   int
}

func openWAL(dir string, w *workload) (log, error) {
	l, _, err := wal.Open(filepath.Join(dir, "wal"), wal.Options{}, func(wal.Pos, []byte) error { return nil })
	if err != nil {
		return nil, err
	}
	return &walLog{l: l, compactAt: w.walCompactAt}, nil
}

func (l *walLog) commit(first uint64, recs [][]byte, ackBelow uint64) error {
	l.buf, l.offs = appendBatch(l.buf[:0], ackBelow, first, recs, l.offs[:0])
	p, err := l.l.Append(l.buf)
	if err != nil {
		return err
	}
	for i, r := range recs {
		l.live = append(l.live, liveRecord{seq: first + uint64(i), at: at(p, l.offs[i]), n: len(r)})
	}
	l.ackBelow = ackBelow
	i := 0
	for i < len(l.live) && l.live[i].seq < ackBelow {
		i++
	}
	l.live = l.live[i:]
	if _, segs := l.l.Sizes(); segs >= l.compactAt {
		return l.compact()
	}
	return nil
}

func at(p wal.Pos, off int) wal.Pos {
	p.Off += int64(off)
	return p
}

// compact writes the live records as a snapshot, each a batch of its own, and removes the
// segments before it.
func (l *walLog) compact() error {
	id, err := l.l.Rotate()
	if err != nil {
		return err
	}
	rec := make([]byte, minRecord+recordSpread)
	err = l.l.WriteSnapshot(id, func(add func([]byte) (wal.Pos, error)) error {
		for i, r := range l.live {
			if err := l.l.ReadAt(r.at, rec[:r.n]); err != nil {
				return err
			}
			l.buf, l.offs = appendBatch(l.buf[:0], l.ackBelow, r.seq, [][]byte{rec[:r.n]}, l.offs[:0])
			p, err := add(l.buf)
			if err != nil {
				return err
			}
			l.live[i].at = at(p, l.offs[0])
		}
		return nil
	})
	if err != nil {
		return err
	}
	return l.l.Compact(id)()
}

func (l *walLog) close() error { return l.l.Close() }

func heldWAL(dir string) (held, error) {
	var h heldBatches
	l, _, err := wal.Open(filepath.Join(dir, "wal"), wal.Options{}, func(_ wal.Pos, b []byte) error { return h.add(b) })
	if err != nil {
		return held{}, err
	}
	if err := l.Close(); err != nil {
		return held{}, err
	}
	return h.result()
}

// boltLog is bbolt as the journal uses it today.
type boltLog struct {
	db    *bolt.DB
	acked uint64
}

var boltBucket = []byte("records")

func openBolt(dir string, _ *workload) (log, error) {
	db, err := bolt.Open(filepath.Join(dir, "bolt.db"), 0o600, &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return nil, err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(boltBucket)
		return err
	})
	if err != nil {
		return nil, errors.Join(err, db.Close())
	}
	return &boltLog{db: db}, nil
}

func boltKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

func (l *boltLog) commit(first uint64, recs [][]byte, ackBelow uint64) error {
	err := l.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(boltBucket)
		for i, r := range recs {
			if err := b.Put(boltKey(first+uint64(i)), r); err != nil {
				return err
			}
		}
		for seq := l.acked; seq < ackBelow; seq++ {
			if err := b.Delete(boltKey(seq)); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		l.acked = max(l.acked, ackBelow)
	}
	return err
}

func (l *boltLog) close() error { return l.db.Close() }

func heldBolt(dir string) (held, error) {
	db, err := bolt.Open(filepath.Join(dir, "bolt.db"), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		return held{}, err
	}
	var h held
	err = db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(boltBucket).Cursor()
		k, _ := c.First()
		lk, lv := c.Last()
		if k == nil {
			return errors.New("no records")
		}
		h = held{first: binary.BigEndian.Uint64(k), last: binary.BigEndian.Uint64(lk), lastRecord: bytes.Clone(lv)}
		if n := tx.Bucket(boltBucket).Stats().KeyN; uint64(n) != h.last-h.first+1 {
			return fmt.Errorf("%d records from %d to %d: some are missing", n, h.first, h.last)
		}
		return nil
	})
	return h, errors.Join(err, db.Close())
}

// raftWALLog is hashicorp/raft-wal as raft uses it: entries with contiguous indexes, and the
// head truncated with DeleteRange.
type raftWALLog struct {
	w         *raftwal.WAL
	meta      *metadb.BoltMetaDB
	logs      []*raft.Log
	trimEvery int
	commits   int
	acked     uint64
}

func openRaftWAL(trimEvery int) func(string, *workload) (log, error) {
	return func(dir string, _ *workload) (log, error) {
		w, meta, err := openRaftWALDir(dir)
		if err != nil {
			return nil, err
		}
		logs := make([]*raft.Log, recordsPerCommit)
		for i := range logs {
			logs[i] = &raft.Log{Term: 1, Type: raft.LogCommand}
		}
		return &raftWALLog{w: w, meta: meta, logs: logs, trimEvery: trimEvery}, nil
	}
}

func (l *raftWALLog) commit(first uint64, recs [][]byte, ackBelow uint64) error {
	for i, r := range recs {
		l.logs[i].Index, l.logs[i].Data = first+uint64(i)+1, r
	}
	if err := l.w.StoreLogs(l.logs[:len(recs)]); err != nil {
		return err
	}
	l.commits++
	if ackBelow > l.acked && l.commits%l.trimEvery == 0 {
		// Records acked to ackBelow-1 are indexes l.acked+1 to ackBelow.
		if err := l.w.DeleteRange(l.acked+1, ackBelow); err != nil {
			return err
		}
		l.acked = ackBelow
	}
	return nil
}

// openRaftWALDir opens the raft-wal in dir with a meta store of the caller's: WAL.Close leaves
// its own open (and its bbolt file locked, so that opening the WAL again in the same process
// waits for ever).
func openRaftWALDir(dir string) (*raftwal.WAL, *metadb.BoltMetaDB, error) {
	meta := &metadb.BoltMetaDB{}
	w, err := raftwal.Open(dir, raftwal.WithMetaStore(meta))
	if err != nil {
		return nil, nil, errors.Join(err, meta.Close())
	}
	return w, meta, nil
}

func (l *raftWALLog) close() error { return errors.Join(l.w.Close(), l.meta.Close()) }

func heldRaftWAL(dir string) (held, error) {
	w, meta, err := openRaftWALDir(dir)
	if err != nil {
		return held{}, err
	}
	first, err1 := w.FirstIndex()
	last, err2 := w.LastIndex()
	var lg raft.Log
	err3 := w.GetLog(last, &lg)
	if err = errors.Join(err1, err2, err3, w.Close(), meta.Close()); err != nil {
		return held{}, err
	}
	return held{first: first - 1, last: last - 1, lastRecord: lg.Data}, nil
}

// pebbleLog is Pebble's WAL writer alone.
type pebbleLog struct {
	w    *record.LogWriter
	buf  []byte
	offs []int
}

// datasyncFile syncs with fdatasync, as Pebble's own WAL files do (vfs.NewSyncingFile).
type datasyncFile struct{ *os.File }

func (f datasyncFile) Sync() error { return unix.Fdatasync(int(f.Fd())) }

const pebbleFile = "000001.log"

func openPebble(dir string, _ *workload) (log, error) {
	f, err := os.OpenFile(filepath.Join(dir, pebbleFile), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	w := record.NewLogWriter(datasyncFile{f}, 1, record.LogWriterConfig{WriteWALSyncOffsets: func() bool { return true }})
	return &pebbleLog{w: w}, nil
}

func (l *pebbleLog) commit(first uint64, recs [][]byte, ackBelow uint64) error {
	l.buf, l.offs = appendBatch(l.buf[:0], ackBelow, first, recs, l.offs[:0])
	var wg sync.WaitGroup
	var syncErr error
	wg.Add(1)
	if _, err := l.w.SyncRecord(l.buf, &wg, &syncErr); err != nil {
		return err
	}
	wg.Wait()
	return syncErr
}

func (l *pebbleLog) close() error { return l.w.Close() }

func heldPebble(dir string) (held, error) {
	f, err := os.Open(filepath.Join(dir, pebbleFile))
	if err != nil {
		return held{}, err
	}
	defer func() { _ = f.Close() }() // opened to read: nothing to lose
	var h heldBatches
	r := record.NewReader(f, 1)
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return h.result()
		}
		var b []byte
		if err == nil {
			b, err = io.ReadAll(rec)
		}
		if err == nil {
			err = h.add(b)
		}
		if err != nil {
			return held{}, err
		}
	}
}

// procIO is the process's write counts from /proc/self/io.
type procIO struct {
	wchar      int64 // bytes handed to write(2) and its kin
	writeBytes int64 // bytes sent to storage, a page for each time a page was dirtied
}

func readProcIO(b *testing.B) procIO {
	b.Helper()
	var p procIO
	for k, v := range procFields(b, "/proc/self/io") {
		switch k {
		case "wchar":
			p.wchar = v
		case "write_bytes":
			p.writeBytes = v
		}
	}
	return p
}

// mappedKiB is the process's resident memory mapped from the files under dir, from
// /proc/self/smaps: a mapping's line (address, permissions, offset, device, inode, path), then
// its fields, Rss among them.
func mappedKiB(b *testing.B, dir string) int64 {
	b.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = f.Close() }() // opened to read: nothing to lose
	var kib int64
	in := false
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		switch {
		case len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":"):
			in = len(fields) >= 6 && strings.HasPrefix(fields[5], dir+string(os.PathSeparator))
		case in && len(fields) >= 2 && fields[0] == "Rss:":
			n, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			kib += n
		}
	}
	if err := s.Err(); err != nil {
		b.Fatal(err)
	}
	return kib
}

// procFields reads a /proc file of "name: value" lines; the values' units are dropped.
func procFields(b *testing.B, path string) map[string]int64 {
	b.Helper()
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = f.Close() }() // opened to read: nothing to lose
	fields := map[string]int64{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if n, err := strconv.ParseInt(strings.Fields(v + " x")[0], 10, 64); ok && err == nil {
			fields[k] = n
		}
	}
	if err := s.Err(); err != nil {
		b.Fatal(err)
	}
	return fields
}

// files calls fn with every regular file under dir.
func files(b *testing.B, dir string, fn func(path string, st *unix.Stat_t)) {
	b.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			return err
		}
		fn(path, &st)
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// dirKiB is the space allocated to the files under dir.
func dirKiB(b *testing.B, dir string) int64 {
	b.Helper()
	var n int64
	files(b, dir, func(_ string, st *unix.Stat_t) { n += st.Blocks * 512 })
	return n >> 10
}

// pageCacheKiB is how much of the files under dir is in the page cache (mincore(2) of a
// mapping, which faults nothing in; x/sys/unix has no wrapper for it).
func pageCacheKiB(b *testing.B, dir string) int64 {
	b.Helper()
	page := int64(os.Getpagesize())
	var pages int64
	files(b, dir, func(path string, st *unix.Stat_t) {
		if st.Size == 0 {
			return
		}
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = f.Close() }() // opened to read: nothing to lose
		m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = unix.Munmap(m) }() // a read-only mapping: nothing to lose
		vec := make([]byte, (st.Size+page-1)/page)
		if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
			b.Fatal(errno)
		}
		for _, v := range vec {
			pages += int64(v & 1)
		}
	})
	return pages * page >> 10
}
