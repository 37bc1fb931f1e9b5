package journal

import "syscall"

// dropMapped tells the kernel the process no longer needs the size bytes of a file mapping at
// addr in memory: their page-table entries go, so they stop counting as its resident memory.
// For a shared file mapping nothing is lost: the next read faults the same page back in from
// the page cache, or from the file if the kernel has reclaimed it meanwhile.
func dropMapped(addr uintptr, size int64) error {
	if addr == 0 || size <= 0 {
		return nil
	}
	if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, addr, uintptr(size), syscall.MADV_DONTNEED); errno != 0 {
		return errno
	}
	return nil
}
