package wal

import (
	"os"

	"golang.org/x/sys/unix"
)

// datasync writes f's data, and what of its metadata is needed to read it back, to the volume.
func datasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }

// dropCache drops f's pages from off for n bytes (n 0: to its end) from the page cache. They
// are clean once synced, so the kernel frees them at once.
func dropCache(f *os.File, off, n int64) {
	_ = unix.Fadvise(int(f.Fd()), off, n, unix.FADV_DONTNEED) // advice: nothing to undo if ignored
}

// lock takes an exclusive lock on f, failing at once if another process holds one.
func lock(f *os.File) error {
	err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == unix.EWOULDBLOCK {
		return ErrLocked
	}
	return err
}

// writeFrame writes a frame's header and payload at off, in one system call unless it writes
// short; then the rest is written, or the reason it cannot be is returned.
func writeFrame(f *os.File, hdr, payload []byte, off int64) error {
	n, err := unix.Pwritev(int(f.Fd()), [][]byte{hdr, payload}, off)
	if err != nil || n == len(hdr)+len(payload) {
		return err
	}
	if n < len(hdr) {
		if _, err := f.WriteAt(hdr[n:], off+int64(n)); err != nil {
			return err
		}
		n = len(hdr)
	}
	_, err = f.WriteAt(payload[n-len(hdr):], off+int64(n))
	return err
}
