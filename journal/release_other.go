//go:build !linux

package journal

// dropMapped does nothing where madvise's MADV_DONTNEED is not known to drop a shared file
// mapping's pages safely.
func dropMapped(uintptr, int64) error { return nil }
