package app

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dynwatch/dynwatch/httpapi"
)

// Starting touches code and tables that running never touches again: every package's
// initialisation (the client's scheme registers every API type), the configuration's
// parsing and checks, CEL's compilers, discovery, the informers' first lists. Their pages of
// the executable stay mapped, and counted in the process's resident memory (RssFile), for as
// long as the process runs: at 10,000 configmaps, the executable's resident pages were 54 to
// 56 MB after sync, and 20 to 23 MB once released (docs/benchmarks.md). Once the parts are
// built, before any informer starts, again once every resource has synced, and once each burst
// of events is over (releaseBurstMemory), releaseStartPages unmaps the executable's read-only
// pages (MADV_DONTNEED): they are clean copies of the file, which the kernel maps again, from
// its page cache, when they are next touched, so what running uses comes back and the rest
// does not. Writable mappings (the executable's initialised data, which running has changed)
// are never touched. The pages stay in the page cache, where the kernel reclaims unmapped ones
// first.

// releaseStartPagesEvery is how often releaseStartPagesOnceReady asks whether every resource
// has synced.
const releaseStartPagesEvery = 250 * time.Millisecond

// releasingReadiness is the informers' readiness, releasing the start's pages the first time
// it finds every resource synced, before it says so. So /readyz's first 200 comes after the
// release, and so does anything a caller measures then; releaseStartPagesOnceReady asks it too,
// for a process nobody probes.
type releasingReadiness struct {
	httpapi.Readiness
	log  *slog.Logger
	once sync.Once
}

func (r *releasingReadiness) Ready() (bool, []string) {
	ready, why := r.Readiness.Ready()
	if ready {
		r.once.Do(func() { releaseStartPagesLogged(r.log, "every resource has synced") })
	}
	return ready, why
}

// releaseStartPagesOnceReady asks r every releaseStartPagesEvery until it is ready (and so has
// released the start's pages) or ctx ends.
func releaseStartPagesOnceReady(ctx context.Context, r *releasingReadiness) {
	t := time.NewTicker(releaseStartPagesEvery)
	defer t.Stop()
	for ready, _ := r.Ready(); !ready; ready, _ = r.Ready() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// releaseStartPagesLogged releases the start's pages and logs what it did, and why now.
func releaseStartPagesLogged(log *slog.Logger, now string) {
	before := residentFileBacked()
	if err := releaseStartPages(); err != nil {
		log.Info("the executable's pages touched while starting were not released", "now", now, "err", err)
		return
	}
	log.Info("released the executable's pages touched while starting", "now", now, "fileBackedBeforeMiB", before>>20, "fileBackedAfterMiB", residentFileBacked()>>20)
}

// residentFileBacked is the process's file-backed resident memory (RssFile) in bytes; 0 if it
// cannot be read.
func residentFileBacked() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "RssFile:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// releaseStartPages unmaps every read-only mapping of the process's executable. The kernel
// maps a page again when it is next touched.
func releaseStartPages() error {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return err
	}
	ranges, err := readOnlyMappings("/proc/self/maps", exe)
	if err != nil {
		return err
	}
	for _, r := range ranges {
		// The mapping's address is not memory Go allocated: unix.Madvise's []byte cannot name it.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, r[0], r[1]-r[0], unix.MADV_DONTNEED); errno != 0 {
			return fmt.Errorf("madvise %#x-%#x: %w", r[0], r[1], errno)
		}
	}
	return nil
}

// readOnlyMappings is the [start, end) of each mapping of path in the maps file that can be
// neither written nor shared.
func readOnlyMappings(maps, path string) ([][2]uintptr, error) {
	f, err := os.Open(maps)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	var ranges [][2]uintptr
	s := bufio.NewScanner(f)
	for s.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(s.Text())
		if len(fields) != 6 || fields[5] != path {
			continue
		}
		if perms := fields[1]; len(perms) != 4 || perms[1] != '-' || perms[3] != 'p' {
			continue
		}
		start, end, _ := strings.Cut(fields[0], "-")
		a, err1 := strconv.ParseUint(start, 16, 64)
		b, err2 := strconv.ParseUint(end, 16, 64)
		if err1 != nil || err2 != nil || b <= a {
			return nil, fmt.Errorf("%s: the line %q", maps, s.Text())
		}
		ranges = append(ranges, [2]uintptr{uintptr(a), uintptr(b)})
	}
	return ranges, s.Err()
}
