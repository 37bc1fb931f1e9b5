package wal

import (
	"io"
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

// writeFrame writes a frame's header and payload's parts at off: in one system call when they
// fit in one (iovMax vectors) and it does not write short, else in as many as it takes.
func writeFrame(f *os.File, hdr []byte, parts [][]byte, off int64) error {
	vec := make([][]byte, 0, min(1+len(parts), iovMax))
	vec = append(vec, hdr)
	for {
		for len(vec) < iovMax && len(parts) > 0 {
			if len(parts[0]) > 0 {
				vec = append(vec, parts[0])
			}
			parts = parts[1:]
		}
		if len(vec) == 0 {
			return nil
		}
		n, err := unix.Pwritev(int(f.Fd()), vec, off)
		if err == unix.EINTR {
			continue // a signal before anything was written (a network file system)
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		off += int64(n)
		// Drop what was written: whole vectors, and the start of the one it stopped in.
		i := 0
		for i < len(vec) && n >= len(vec[i]) {
			n -= len(vec[i])
			i++
		}
		if n > 0 {
			vec[i] = vec[i][n:]
		}
		vec = vec[:copy(vec, vec[i:])]
	}
}

// iovMax is the most vectors one pwritev(2) takes on Linux (IOV_MAX).
const iovMax = 1024
