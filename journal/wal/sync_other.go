//go:build !linux

package wal

import "os"

func datasync(f *os.File) error { return f.Sync() }

func dropCache(*os.File, int64, int64) {}

func lock(*os.File) error { return nil }

func writeFrame(f *os.File, hdr []byte, parts [][]byte, off int64) error {
	if _, err := f.WriteAt(hdr, off); err != nil {
		return err
	}
	off += int64(len(hdr))
	for _, b := range parts {
		if _, err := f.WriteAt(b, off); err != nil {
			return err
		}
		off += int64(len(b))
	}
	return nil
}
