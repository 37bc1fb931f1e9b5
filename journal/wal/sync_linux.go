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
