package app

import (
	"context"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"
)

// TestGOGCIs25UnlessTheEnvironmentSetsIt: dynwatch sets the collector's GOGC to gcPercent,
// and leaves a GOGC from the environment alone.
func TestGOGCIs25UnlessTheEnvironmentSetsIt(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })
	log := slog.New(slog.DiscardHandler)

	t.Setenv("GOGC", "") // restored when the test ends
	if err := os.Unsetenv("GOGC"); err != nil {
		t.Fatal(err)
	}
	setGCPercent(log)
	if got := debug.SetGCPercent(100); got != gcPercent {
		t.Errorf("without GOGC in the environment, GOGC = %d; want %d", got, gcPercent)
	}

	t.Setenv("GOGC", "200")
	setGCPercent(log)
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("with GOGC=200 in the environment, dynwatch changed GOGC to %d", got)
	}
}

// TestAFinishedBurstsFreedHeapIsReturnedToTheOS: once a burst's backlog drains, what it held
// is collected and its pages returned to the OS, not kept for the scavenger.
func TestAFinishedBurstsFreedHeapIsReturnedToTheOS(t *testing.T) {
	var backlog atomic.Int64
	backlog.Store(burstBacklog)
	returnUntilTheEnd(t, func() bool { return true }, &backlog, releaseBurstMemory)

	const garbage = 64 << 20
	held := make([][]byte, 0, garbage>>16)
	for range garbage >> 16 {
		b := make([]byte, 1<<16)
		b[0] = 1 // touched: resident
		held = append(held, b)
	}
	before := heapReleased()
	runtime.KeepAlive(held) // and no longer: garbage from here on
	backlog.Store(0)
	deadline := time.Now().Add(10 * time.Second)
	for heapReleased()-before < garbage*3/4 {
		if time.Now().After(deadline) {
			t.Fatalf("%d MiB of %d MiB of a burst's garbage returned to the OS 10 s after its backlog drained", (heapReleased()-before)>>20, garbage>>20)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAFinishedBurstsExecutablePagesAreReleased: the executable's pages mapped while a burst
// lasted (here: every page of its read-only mappings) are unmapped once its backlog drains.
func TestAFinishedBurstsExecutablePagesAreReleased(t *testing.T) {
	var backlog atomic.Int64
	backlog.Store(burstBacklog)
	returnUntilTheEnd(t, func() bool { return true }, &backlog, releaseBurstMemory)

	touchExecutable(t)
	before := residentFileBacked()
	if before < 8<<20 {
		t.Fatalf("RssFile %d KiB once every page of the executable was touched; want at least 8 MiB for the test to mean something", before>>10)
	}
	backlog.Store(0)
	deadline := time.Now().Add(10 * time.Second)
	for residentFileBacked() >= before/2 {
		if time.Now().After(deadline) {
			t.Fatalf("RssFile %d KiB 10 s after the burst's backlog drained, %d KiB before; want less than half", residentFileBacked()>>10, before>>10)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// touchExecutable maps every page of the test binary's read-only mappings into the process,
// reading one byte of each through /proc/self/mem, which faults the page in as a read would,
// and returns the mappings' size.
func touchExecutable(t *testing.T) uint64 {
	t.Helper()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	ranges, err := readOnlyMappings("/proc/self/maps", exe)
	if err != nil || len(ranges) == 0 {
		t.Fatalf("the executable's read-only mappings: %v (%d)", err, len(ranges))
	}
	mem, err := os.Open("/proc/self/mem")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mem.Close() }() // read only
	b := make([]byte, 1)
	var size uint64
	for _, r := range ranges {
		for at := r[0]; at < r[1]; at += 4096 {
			if _, err := mem.ReadAt(b, int64(at)); err != nil {
				t.Fatalf("read %#x of the executable's mapping: %v", at, err)
			}
		}
		size += uint64(r[1] - r[0])
	}
	return size
}

// TestMemoryIsReturnedOnceABurstIsOverAndOnlyThen: nothing is returned while a burst's backlog
// waits or before every resource has synced; then once; then not again until another burst.
func TestMemoryIsReturnedOnceABurstIsOverAndOnlyThen(t *testing.T) {
	var backlog, releases atomic.Int64
	var ready atomic.Bool
	backlog.Store(burstBacklog)
	returnUntilTheEnd(t, ready.Load, &backlog, func() error { releases.Add(1); return nil })
	ticks := func(n int) { time.Sleep(time.Duration(n) * returnMemoryEvery) }
	waitReleases := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for releases.Load() < want {
			if time.Now().After(deadline) {
				t.Fatalf("%d releases 10 s after the burst was over; want %d", releases.Load(), want)
			}
			time.Sleep(returnMemoryEvery / 4)
		}
	}

	ticks(4)
	if n := releases.Load(); n != 0 {
		t.Fatalf("%d releases before anything synced, with a backlog of %d", n, burstBacklog)
	}
	ready.Store(true)
	ticks(4)
	if n := releases.Load(); n != 0 {
		t.Fatalf("%d releases while a backlog of %d waited", n, burstBacklog)
	}
	backlog.Store(1)
	ticks(4)
	if n := releases.Load(); n != 0 {
		t.Fatalf("%d releases with one event left", n)
	}
	backlog.Store(0)
	waitReleases(1)
	backlog.Store(burstBacklog - 1)
	ticks(2)
	backlog.Store(0)
	ticks(4)
	if n := releases.Load(); n != 1 {
		t.Fatalf("%d releases after a backlog under burstBacklog drained; want still 1", n)
	}
	backlog.Store(burstBacklog)
	ticks(2)
	backlog.Store(0)
	waitReleases(2)
}

// returnUntilTheEnd runs returnMemoryAfterBursts with ready, the backlog's count and release
// until the test ends.
func returnUntilTheEnd(t *testing.T, ready func() bool, backlog *atomic.Int64, release func() error) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		returnMemoryAfterBursts(ctx, slog.New(slog.DiscardHandler), ready, func() int { return int(backlog.Load()) }, release)
	}()
	t.Cleanup(func() { cancel(); <-done })
}
