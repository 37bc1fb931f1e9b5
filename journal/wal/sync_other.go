//go:build !linux

package wal

import "os"

func datasync(f *os.File) error { return f.Sync() }

func dropCache(*os.File, int64, int64) {}

func lock(*os.File) error { return nil }
