package wal

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SegmentSize is the size past which Append begins a new segment.
const SegmentSize = 64 << 20

// MaxPayload bounds a frame's payload.
const MaxPayload = 1 << 30

// headerSize is a frame's header: the payload's length, the CRC-32C of those four bytes, and
// the CRC-32C of the payload, each little-endian. The length's own checksum tells a frame
// from bytes that merely happen to follow one (zeros, or garbage) without reading on.
const headerSize = 12

// ErrLocked is another process holding the log.
var ErrLocked = errors.New("another process has the log open")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Pos is where a payload lies: in segment or snapshot File, from byte Off.
type Pos struct {
	File uint64
	Snap bool
	Off  int64
}

// Recovery is what Open found wrong, and did about it.
type Recovery struct {
	// TornTail is how many bytes of a frame cut short by a crash were truncated.
	TornTail int64
	// Damaged is the directory the damaged frames (and everything after them) were moved to,
	// "" when there were none; DamageErr says what was wrong.
	Damaged   string
	DamageErr error
}

type fileKey struct {
	id   uint64
	snap bool
}

func (k fileKey) name() string {
	if k.snap {
		return fmt.Sprintf("snap-%016x.wal", k.id)
	}
	return fmt.Sprintf("seg-%016x.wal", k.id)
}

// parseName reads a file's key from its name; false for a file not the log's.
func parseName(name string) (fileKey, bool) {
	rest, ok := strings.CutSuffix(name, ".wal")
	if !ok {
		return fileKey{}, false
	}
	var k fileKey
	switch {
	case strings.HasPrefix(rest, "snap-"):
		k.snap, rest = true, rest[len("snap-"):]
	case strings.HasPrefix(rest, "seg-"):
		rest = rest[len("seg-"):]
	default:
		return fileKey{}, false
	}
	id, err := strconv.ParseUint(rest, 16, 64)
	return fileKey{id: id, snap: k.snap}, err == nil && len(rest) == 16
}

// Log is a directory of segments and at most one snapshot.
type Log struct {
	dir   string
	lockf *os.File

	mu    sync.RWMutex // files: ReadAt and Release read it while Compact and Close change it
	files map[fileKey]*os.File

	// Owned by the appending goroutine.
	segLimit int64                // Options.SegmentSize; a test sets it lower
	datasync func(*os.File) error // the package's; a test makes it fail
	cur      fileKey
	curF     *os.File
	curSize  int64
	broken   error // a failed append's partial frame is still to be cut off
	// synced is how much of the segment is durable; pending are the frames written after it,
	// kept to be written again if a sync fails (the kernel may have dropped their pages).
	synced     int64
	dropped    int64 // where the segment's pages not yet dropped begin (see dropBatch)
	pending    []written
	syncFailed bool
	started    *syncing // the sync StartSync began, until FinishSync
	frames     uint64   // how many frames Write has written since Open
	snapSize   int64    // the snapshot's size
	segSize    int64    // the size of the segments at or after the snapshot
	base       uint64
}

// Options are what a Log may be given besides its directory.
type Options struct {
	// Datasync makes a file's data durable, with what of its metadata is needed to read it
	// back; nil is fdatasync(2). A test gives one that is slow, or fails.
	Datasync func(*os.File) error
	// SegmentSize is the size past which Write begins a new segment; 0 is the package's
	// SegmentSize. A caller that begins segments itself (Rotate) where its records need it
	// gives one it never reaches.
	SegmentSize int64
}

// Open opens the log in dir, creating it if need be, and hands replay every payload in order:
// the snapshot's, then the segments'. replay must copy what it keeps of a payload. A torn tail
// is truncated and damage set aside (see the package's guarantees), as the Recovery returned
// says. It fails with ErrLocked at once (within a second) if another process holds the log.
func Open(dir string, o Options, replay func(Pos, []byte) error) (*Log, Recovery, error) {
	var rec Recovery
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, rec, err
	}
	if o.Datasync == nil {
		o.Datasync = datasync
	}
	// Cleaned, so that the damage directory <dir>.damaged-<time> lies beside the log even when
	// dir ends in a separator.
	if o.SegmentSize <= 0 {
		o.SegmentSize = SegmentSize
	}
	l := &Log{dir: filepath.Clean(dir), files: map[fileKey]*os.File{}, segLimit: o.SegmentSize, datasync: o.Datasync}
	if err := l.lock(); err != nil {
		return nil, rec, err
	}
	keys, err := l.list()
	if err == nil {
		rec, err = l.replay(keys, replay)
	}
	if err == nil {
		err = l.openTail()
	}
	if err != nil {
		return nil, rec, errors.Join(err, l.Close())
	}
	return l, rec, nil
}

func (l *Log) lock() error {
	f, err := os.OpenFile(filepath.Join(l.dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(time.Second); ; time.Sleep(50 * time.Millisecond) {
		err = lock(f)
		if !errors.Is(err, ErrLocked) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		_ = f.Close() // not locked: nothing to undo
		return err
	}
	l.lockf = f
	return nil
}

// list removes what an interrupted snapshot or compaction left, and returns the files to read
// in order: the newest snapshot, then the segments from it on.
func (l *Log) list() ([]fileKey, error) {
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, err
	}
	var snaps, segs []fileKey
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			if err := os.Remove(filepath.Join(l.dir, e.Name())); err != nil {
				return nil, err
			}
			continue
		}
		if k, ok := parseName(e.Name()); ok && k.snap {
			snaps = append(snaps, k)
		} else if ok {
			segs = append(segs, k)
		}
	}
	byID := func(a, b fileKey) int { return cmpID(a.id, b.id) }
	slices.SortFunc(snaps, byID)
	slices.SortFunc(segs, byID)
	var keys []fileKey
	if len(snaps) > 0 {
		l.base = snaps[len(snaps)-1].id
		keys = append(keys, snaps[len(snaps)-1])
	}
	for _, k := range slices.Concat(snaps[:max(len(snaps)-1, 0)], segs) {
		if k.snap || k.id < l.base {
			// Superseded by the snapshot: a compaction stopped before removing it.
			if err := os.Remove(filepath.Join(l.dir, k.name())); err != nil {
				return nil, err
			}
			continue
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func cmpID(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// replay reads keys' files in order, handing fn each payload.
func (l *Log) replay(keys []fileKey, fn func(Pos, []byte) error) (Recovery, error) {
	var rec Recovery
	for i, k := range keys {
		f, err := os.OpenFile(filepath.Join(l.dir, k.name()), os.O_RDWR, 0)
		if err != nil {
			return rec, err
		}
		l.files[k] = f
		end, bad, err := readFrames(f, k, fn)
		if err != nil {
			return rec, err
		}
		size := k.size(l)
		if k.snap {
			l.snapSize = size
		} else {
			l.segSize += size
		}
		if bad == nil {
			continue
		}
		if i == len(keys)-1 && !k.snap && bad.torn {
			rec.TornTail = size - end
			if err := l.truncate(f, k, end); err != nil {
				return rec, err
			}
			continue
		}
		rec.Damaged, rec.DamageErr = fmt.Sprintf("%s.damaged-%s", l.dir, time.Now().UTC().Format("20060102T150405.000Z")), fmt.Errorf("%s at offset %d: %w", k.name(), end, bad.err)
		return rec, l.setAside(rec.Damaged, f, k, end, keys[i+1:])
	}
	return rec, nil
}

// size is the size of k's file as last read or written.
func (k fileKey) size(l *Log) int64 {
	st, err := l.files[k].Stat()
	if err != nil {
		return 0
	}
	return st.Size()
}

func (l *Log) truncate(f *os.File, k fileKey, at int64) error {
	size := k.size(l)
	if err := f.Truncate(at); err != nil {
		return err
	}
	if k.snap {
		l.snapSize -= size - at
	} else {
		l.segSize -= size - at
	}
	return datasync(f)
}

// setAside copies f (whole) into dir, moves the later files there, and truncates f at the
// damage.
func (l *Log) setAside(dir string, f *os.File, k fileKey, at int64, later []fileKey) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	dst, err := os.Create(filepath.Join(dir, k.name()))
	if err != nil {
		return err
	}
	_, err = io.Copy(dst, io.NewSectionReader(f, 0, 1<<62))
	if err = errors.Join(err, dst.Sync(), dst.Close()); err != nil {
		return err
	}
	for _, lk := range later {
		if err := os.Rename(filepath.Join(l.dir, lk.name()), filepath.Join(dir, lk.name())); err != nil {
			return err
		}
	}
	if err := errors.Join(syncDir(dir), syncDir(l.dir)); err != nil {
		return err
	}
	return l.truncate(f, k, at)
}

// badFrame is why reading stopped short of a file's end.
type badFrame struct {
	torn bool // what a crash leaves: the last frame reaches past the end, or zeros follow
	err  error
}

// readFrames hands fn each frame's payload in f, and returns where the frames that check end
// and, if that is short of the file's end, why.
func readFrames(f *os.File, k fileKey, fn func(Pos, []byte) error) (int64, *badFrame, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, nil, err
	}
	size := st.Size()
	r := bufio.NewReaderSize(io.NewSectionReader(f, 0, size), 1<<20)
	defer dropCache(f, 0, 0)
	var off int64
	var hdr [headerSize]byte
	var payload []byte
	for off < size {
		if size-off < headerSize {
			return off, &badFrame{torn: true, err: errors.New("a frame's header cut short")}, nil
		}
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return off, nil, err
		}
		n := binary.LittleEndian.Uint32(hdr[0:])
		if crc32.Checksum(hdr[0:4], castagnoli) != binary.LittleEndian.Uint32(hdr[4:]) || n == 0 || n > MaxPayload {
			zeros, err := allZero(f, off, size)
			if err != nil {
				return off, nil, err
			}
			return off, &badFrame{torn: zeros, err: errors.New("a frame's header does not check")}, nil
		}
		if off+headerSize+int64(n) > size {
			return off, &badFrame{torn: true, err: errors.New("a frame reaches past the end of the file")}, nil
		}
		if cap(payload) < int(n) {
			payload = make([]byte, n)
		}
		payload = payload[:n]
		if _, err := io.ReadFull(r, payload); err != nil {
			return off, nil, err
		}
		if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(hdr[8:]) {
			return off, &badFrame{torn: off+headerSize+int64(n) == size, err: errors.New("a frame's payload does not check")}, nil
		}
		if err := fn(Pos{File: k.id, Snap: k.snap, Off: off + headerSize}, payload); err != nil {
			return off, nil, err
		}
		off += headerSize + int64(n)
	}
	return off, nil, nil
}

// allZero reports whether f holds only zeros from off to size.
func allZero(f *os.File, off, size int64) (bool, error) {
	buf := make([]byte, 64<<10)
	for off < size {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), size-off)], off)
		if err != nil && !errors.Is(err, io.EOF) {
			return false, err
		}
		if len(bytes.Trim(buf[:n], "\x00")) > 0 {
			return false, nil
		}
		off += int64(n)
	}
	return true, nil
}

// openTail makes the last segment the one to append to, beginning one if there is none.
func (l *Log) openTail() error {
	for k := range l.files {
		if !k.snap && (l.cur == fileKey{} || k.id > l.cur.id) {
			l.cur = k
		}
	}
	if (l.cur == fileKey{}) {
		_, err := l.begin(max(l.base, 1))
		return err
	}
	l.curF, l.curSize = l.files[l.cur], l.cur.size(l)
	l.synced, l.dropped = l.curSize, 0
	return nil
}

// begin creates segment id and makes it the one to append to.
func (l *Log) begin(id uint64) (uint64, error) {
	k := fileKey{id: id}
	f, err := os.OpenFile(filepath.Join(l.dir, k.name()), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return 0, err
	}
	if err := syncDir(l.dir); err != nil {
		return 0, errors.Join(err, f.Close(), os.Remove(f.Name()))
	}
	l.mu.Lock()
	l.files[k] = f
	l.mu.Unlock()
	l.cur, l.curF, l.curSize, l.synced, l.dropped = k, f, 0, 0, 0
	return id, nil
}

// written is a frame written and not yet synced: where it begins, and its bytes.
type written struct {
	off   int64
	hdr   [headerSize]byte
	parts [][]byte
}

// Append writes payload as one frame at the end of the log and syncs it: Write, then Sync.
func (l *Log) Append(payload []byte) (Pos, error) {
	p, err := l.Write(payload)
	if err == nil {
		err = l.Sync()
	}
	return p, err
}

// Write writes the concatenation of parts, the payload, as one frame at the end of the log,
// without syncing it: it is in the kernel's hands (a crash of the process loses nothing of
// it), durable once Sync has returned. The parts are written where they lie, in as few system
// calls as the kernel takes vectors: a caller passes the large values it holds anyway rather
// than copying them into a buffer. The log keeps the parts until the sync, to write them again
// if it fails: the caller must change neither the slice nor the bytes of any part.
// A failed Write leaves nothing of its frame behind. After a failed Sync, Write first writes
// again what that Sync was to make durable.
func (l *Log) Write(parts ...[]byte) (Pos, error) {
	size := 0
	for _, b := range parts {
		size += len(b)
	}
	if size == 0 || size > MaxPayload {
		return Pos{}, fmt.Errorf("a payload of %d bytes: it must have 1 to %d", size, MaxPayload)
	}
	if err := l.cutOff(); err != nil {
		return Pos{}, err
	}
	if err := l.rewrite(); err != nil {
		return Pos{}, err
	}
	if l.curSize >= l.segLimit {
		if _, err := l.Rotate(); err != nil {
			return Pos{}, err
		}
	}
	w := written{off: l.curSize, parts: parts}
	binary.LittleEndian.PutUint32(w.hdr[0:], uint32(size))
	binary.LittleEndian.PutUint32(w.hdr[4:], crc32.Checksum(w.hdr[0:4], castagnoli))
	var crc uint32
	for _, b := range parts {
		crc = crc32.Update(crc, castagnoli, b)
	}
	binary.LittleEndian.PutUint32(w.hdr[8:], crc)
	if err := writeFrame(l.curF, w.hdr[:], parts, w.off); err != nil {
		if terr := l.curF.Truncate(l.curSize); terr != nil {
			l.broken = err
		}
		return Pos{}, err
	}
	l.pending = append(l.pending, w)
	l.frames++
	n := int64(headerSize + size)
	p := Pos{File: l.cur.id, Off: l.curSize + headerSize}
	l.curSize += n
	l.segSize += n
	return p, nil
}

// Sync makes every frame written durable (one fdatasync), and drops their pages from the page
// cache. If it fails, the frames are written again before anything else is (Write, Sync,
// Rotate, Close), so that the pages a failed fdatasync may have dropped are not lost. A sync
// StartSync began is waited for first, and its outcome put into effect.
func (l *Log) Sync() error {
	if s := l.started; s != nil && !s.applied {
		if err := l.apply(s); err != nil {
			return err
		}
	}
	if err := l.rewrite(); err != nil {
		return err
	}
	if l.synced == l.curSize {
		return nil
	}
	if err := l.datasync(l.curF); err != nil {
		l.syncFailed = true
		return err
	}
	l.syncedTo(l.curSize, len(l.pending))
	return nil
}

// syncing is an fdatasync running on a goroutine of its own: of the frames written up to end,
// the first frames of pending.
type syncing struct {
	end     int64
	frames  int
	done    chan struct{}
	err     error // set before done is closed
	applied bool  // its outcome is in effect
}

// StartSync begins making every frame written so far durable, as Sync does, but on a goroutine
// of its own: it returns at once, and Write may go on meanwhile. The channel it returns is
// closed once the fdatasync has returned; FinishSync then puts its outcome into effect (until
// then the frames count as unsynced) and returns it. Until FinishSync, StartSync returns that
// channel again. It returns a nil channel when nothing is unsynced. After a failed sync it
// first writes again what that sync was to make durable, as Sync does.
func (l *Log) StartSync() (<-chan struct{}, error) {
	if l.started != nil {
		return l.started.done, nil
	}
	if err := l.rewrite(); err != nil {
		return nil, err
	}
	if l.synced == l.curSize {
		return nil, nil
	}
	s := &syncing{end: l.curSize, frames: len(l.pending), done: make(chan struct{})}
	l.started = s
	go func(f *os.File) {
		s.err = l.datasync(f)
		close(s.done)
	}(l.curF)
	return s.done, nil
}

// FinishSync waits for the sync StartSync began, puts its outcome into effect unless Sync,
// Rotate or Close has already, and returns its error: the frames it was to make durable are
// synced (and their pages dropped), or are written again before anything else, as after a
// failed Sync. It returns nil when StartSync began none.
func (l *Log) FinishSync() error {
	s := l.started
	if s == nil {
		return nil
	}
	l.started = nil
	if !s.applied {
		return l.apply(s)
	}
	return s.err
}

// apply waits for s and puts its outcome into effect.
func (l *Log) apply(s *syncing) error {
	<-s.done
	s.applied = true
	if s.err != nil {
		l.syncFailed = true
		return s.err
	}
	l.syncedTo(s.end, s.frames)
	return nil
}

// dropBatch is how much a sync leaves written and cached before the pages are dropped: a
// drop (fadvise(2)) per sync cost about 70 µs of CPU, 2% of dynwatch's at 300 updates a
// second, for pages the kernel would reclaim first anyway.
const dropBatch = 1 << 20

// syncedTo notes that the segment is durable up to end, the end of the first frames of
// pending: the log holds their payloads no longer, and once dropBatch is synced since the
// last drop, the pages are dropped.
func (l *Log) syncedTo(end int64, frames int) {
	if end-l.dropped >= dropBatch {
		dropWritten(l.curF, l.dropped, end)
		l.dropped = end / int64(os.Getpagesize()) * int64(os.Getpagesize())
	}
	clear(l.pending[:frames]) // the payloads are the callers': hold none past the sync
	n := copy(l.pending, l.pending[frames:])
	clear(l.pending[n:])
	l.synced, l.pending = end, l.pending[:n]
}

// dropWritten drops from the page cache the pages that the frames from off to end filled: all
// but the last if they end inside it. The next frame is written into that page; had it been
// dropped, the kernel would read it back from the volume first. (Asked to drop exactly the
// frames' bytes, the kernel, which drops only whole pages, would instead keep the page each
// sync's frames begin in: one more page cached for every sync.)
func dropWritten(f *os.File, off, end int64) {
	page := int64(os.Getpagesize())
	if from, to := off/page*page, end/page*page; to > from {
		dropCache(f, from, to-from)
	}
}

// Written is how many frames Write has written since Open: the last one's number, counting
// from 1.
func (l *Log) Written() uint64 { return l.frames }

// Durable is how many of the frames written since Open are durable: those up to that number
// (see Written), which the log holds no longer.
func (l *Log) Durable() uint64 { return l.frames - uint64(len(l.pending)) }

// Unsynced reports whether something written is not yet durable.
func (l *Log) Unsynced() bool { return l.synced != l.curSize || l.syncFailed }

// UnsyncedBytes is how much has been written since the last Sync: the frames the log holds in
// memory until then, and whose pages the kernel holds dirty.
func (l *Log) UnsyncedBytes() int64 { return l.curSize - l.synced }

// rewrite writes again, after a failed Sync, the frames that Sync was to make durable.
func (l *Log) rewrite() error {
	if !l.syncFailed {
		return nil
	}
	for _, w := range l.pending {
		if err := writeFrame(l.curF, w.hdr[:], w.parts, w.off); err != nil {
			return fmt.Errorf("write again what a failed sync left: %w", err)
		}
	}
	l.syncFailed = false
	return nil
}

// cutOff cuts a failed append's partial frame off the segment, if an earlier attempt could
// not. It runs before anything else is written, and before the segment is left behind by
// Rotate or Close: a partial frame left in a segment that is not the last would read back as
// damage, and set aside every segment after it.
func (l *Log) cutOff() error {
	if l.broken == nil {
		return nil
	}
	if err := l.curF.Truncate(l.curSize); err != nil {
		return fmt.Errorf("cut off a failed append: %w", errors.Join(l.broken, err))
	}
	l.broken = nil
	return nil
}

// Rotate begins a new segment and returns its id: everything appended before it lies in
// earlier segments, which a snapshot of that id replaces.
func (l *Log) Rotate() (uint64, error) {
	if err := l.cutOff(); err != nil {
		return 0, err
	}
	if l.curSize == 0 {
		return l.cur.id, nil
	}
	// Only the last segment may end in a torn frame: this one is made durable before the next.
	if err := l.Sync(); err != nil {
		return 0, err
	}
	return l.begin(l.cur.id + 1)
}

// ReadAt reads len(buf) bytes at p.
func (l *Log) ReadAt(p Pos, buf []byte) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	f := l.files[fileKey{id: p.File, snap: p.Snap}]
	if f == nil {
		return fmt.Errorf("%s: no such file in the log", fileKey{id: p.File, snap: p.Snap}.name())
	}
	_, err := f.ReadAt(buf, p.Off)
	return err
}

// WriteSnapshot writes snapshot id: fill hands add each payload, and add returns where it
// will lie once WriteSnapshot has returned without error. It may run in a goroutine of its own,
// at once with Append and Rotate. Once it has returned the snapshot is in place: the next Open
// reads it instead of the segments before id (and removes them) even if Compact(id) never ran.
// Until Compact(id) runs, the live log keeps those segments and Sizes leaves the snapshot out.
func (l *Log) WriteSnapshot(id uint64, fill func(add func([]byte) (Pos, error)) error) error {
	k := fileKey{id: id, snap: true}
	path := filepath.Join(l.dir, k.name())
	f, err := os.OpenFile(path+".tmp", os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	var off int64
	add := func(payload []byte) (Pos, error) {
		if len(payload) == 0 || len(payload) > MaxPayload {
			return Pos{}, fmt.Errorf("a payload of %d bytes: it must have 1 to %d", len(payload), MaxPayload)
		}
		var hdr [headerSize]byte
		binary.LittleEndian.PutUint32(hdr[0:], uint32(len(payload)))
		binary.LittleEndian.PutUint32(hdr[4:], crc32.Checksum(hdr[0:4], castagnoli))
		binary.LittleEndian.PutUint32(hdr[8:], crc32.Checksum(payload, castagnoli))
		_, _ = w.Write(hdr[:]) // a write error stays in w: Flush returns it
		_, _ = w.Write(payload)
		p := Pos{File: id, Snap: true, Off: off + headerSize}
		off += int64(headerSize + len(payload))
		return p, nil
	}
	err = fill(add)
	if err == nil {
		err = w.Flush()
	}
	// A snapshot written and not yet in place, for the robustness harness to kill dynwatch
	// mid-snapshot (a failpoint: see test/runner.BuildWithFailpoints).
	// gofail: var beforeSnapshotRename struct{}
	if err == nil {
		err = datasync(f)
	}
	if err == nil {
		err = os.Rename(path+".tmp", path)
	}
	if err == nil {
		err = syncDir(l.dir)
	}
	if err != nil {
		return errors.Join(err, f.Close(), os.Remove(path+".tmp"))
	}
	dropCache(f, 0, 0)
	l.mu.Lock()
	old := l.files[k]
	l.files[k] = f
	l.mu.Unlock()
	if old != nil {
		_ = old.Close() // a snapshot written again over itself: the old one is read only
	}
	return nil
}

// Compact makes snapshot id the log's base: it drops every earlier snapshot and every segment
// before id. Positions in them are not readable once it returns. It returns the removal of
// their files (and the sync of the directory), for the caller to run where it likes: unlinking
// segments of 64 MiB and syncing the directory takes tens of milliseconds on a busy volume.
// Until it has run the files stay, and the next Open removes them.
func (l *Log) Compact(id uint64) (remove func() error) {
	l.mu.Lock()
	var gone []string
	for k, f := range l.files {
		if k.id < id || k.snap && k.id != id {
			gone = append(gone, filepath.Join(l.dir, k.name()))
			_ = f.Close() // read only from here on: nothing to lose
			delete(l.files, k)
		}
	}
	l.base = id
	l.snapSize = fileKey{id: id, snap: true}.size(l)
	l.segSize = 0
	for k := range l.files {
		if !k.snap {
			l.segSize += k.size(l)
		}
	}
	l.mu.Unlock()
	return func() error {
		var err error
		for _, path := range gone {
			err = errors.Join(err, os.Remove(path))
		}
		return errors.Join(err, syncDir(l.dir))
	}
}

// Drop drops every segment before segment id, with no snapshot in their place: a log kept for
// a retention forgets its oldest records. It returns the removal of their files, as Compact
// does; positions in them are not readable once it returns. The segment appended to is never
// dropped.
func (l *Log) Drop(id uint64) (remove func() error) {
	id = min(id, l.cur.id)
	l.mu.Lock()
	var gone []string
	for k, f := range l.files {
		if !k.snap && k.id < id {
			l.segSize -= k.size(l)
			gone = append(gone, filepath.Join(l.dir, k.name()))
			_ = f.Close() // read only from here on: nothing to lose
			delete(l.files, k)
		}
	}
	l.mu.Unlock()
	return func() error {
		var err error
		for _, path := range gone {
			err = errors.Join(err, os.Remove(path))
		}
		return errors.Join(err, syncDir(l.dir))
	}
}

// Sizes are the snapshot's size and that of the segments after it, in bytes.
func (l *Log) Sizes() (snapshot, segments int64) { return l.snapSize, l.segSize }

// Release drops the log's pages from the page cache: what reads brought in.
func (l *Log) Release() {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, f := range l.files {
		dropCache(f, 0, 0)
	}
}

// Close cuts off what a failed Append could not, closes the log's files and releases its
// lock.
func (l *Log) Close() error {
	var err error
	if l.curF != nil {
		if err = l.cutOff(); err == nil {
			err = l.Sync()
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, f := range l.files {
		err = errors.Join(err, f.Close())
		delete(l.files, k)
	}
	if l.lockf != nil {
		err = errors.Join(err, l.lockf.Close())
		l.lockf = nil
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
