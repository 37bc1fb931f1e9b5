package app

import (
	"bytes"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// changedAtRun is initialised data (the executable's writable mapping) that the test changes
// before the release: a release that unmapped writable pages would put its value back to 1.
var changedAtRun = 1

// TestReleasingTheStartPagesLowersFileBackedMemoryAndKeepsData: the test binary's file-backed
// resident memory falls, what the process changed in its own data is kept, and its code runs
// on (its pages mapped again as touched).
func TestReleasingTheStartPagesLowersFileBackedMemoryAndKeepsData(t *testing.T) {
	changedAtRun = 42
	before := residentFileBacked()
	if before == 0 {
		t.Fatal("no RssFile in /proc/self/status")
	}
	if err := releaseStartPages(); err != nil {
		t.Fatal(err)
	}
	after := residentFileBacked()
	if after >= before/2 {
		t.Errorf("RssFile %d KiB before the release, %d KiB after; want less than half", before>>10, after>>10)
	}
	if changedAtRun != 42 {
		t.Errorf("a changed variable is %d after the release; want 42", changedAtRun)
	}
	if _, err := readOnlyMappings("/proc/self/maps", os.Args[0]); err != nil {
		t.Errorf("the code after the release: %v", err)
	}
}

// TestOnlyReadOnlyPrivateMappingsOfTheExecutableAreReleased: writable, shared and other
// files' mappings are left alone.
func TestOnlyReadOnlyPrivateMappingsOfTheExecutableAreReleased(t *testing.T) {
	maps := t.TempDir() + "/maps"
	const text = `00400000-01000000 r-xp 00000000 fd:01 42 /bin/dynwatch
01000000-02000000 r--p 00c00000 fd:01 42 /bin/dynwatch
02000000-02100000 rw-p 01c00000 fd:01 42 /bin/dynwatch
02100000-02200000 rw-p 00000000 00:00 0
03000000-03100000 r--s 00000000 fd:01 43 /bin/dynwatch
7f0000000000-7f0000001000 r--p 00000000 fd:01 44 /lib/other.so
7f0000002000-7f0000003000 r-xp 00000000 fd:01 42 /bin/dynwatch (deleted)
`
	if err := os.WriteFile(maps, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readOnlyMappings(maps, "/bin/dynwatch")
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]uintptr{{0x400000, 0x1000000}, {0x1000000, 0x2000000}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("released %x; want %x", got, want)
	}
}

// flippingReadiness is not ready until ready is set.
type flippingReadiness struct{ ready atomic.Bool }

func (f *flippingReadiness) Ready() (bool, []string) {
	if f.ready.Load() {
		return true, nil
	}
	return false, []string{"configmaps: syncing"}
}

// TestTheStartPagesAreReleasedOnceBeforeTheFirstReadyAnswer: not while the informers sync; the
// first answer that they have synced comes after the release (its log line is written by
// then); later answers release nothing more.
func TestTheStartPagesAreReleasedOnceBeforeTheFirstReadyAnswer(t *testing.T) {
	var logged bytes.Buffer
	informers := &flippingReadiness{}
	r := &releasingReadiness{Readiness: informers, log: slog.New(slog.NewTextHandler(&logged, nil))}
	const line = "released the executable's pages touched while starting"
	if ready, why := r.Ready(); ready || len(why) != 1 {
		t.Fatalf("ready %v (%v) while syncing", ready, why)
	}
	if strings.Contains(logged.String(), line) {
		t.Fatalf("released while syncing: %s", logged.String())
	}
	informers.ready.Store(true)
	if ready, _ := r.Ready(); !ready {
		t.Fatal("not ready once synced")
	}
	if n := strings.Count(logged.String(), line); n != 1 {
		t.Fatalf("released %d times by the first ready answer; want once: %s", n, logged.String())
	}
	r.Ready()
	if n := strings.Count(logged.String(), line); n != 1 {
		t.Errorf("released %d times after two ready answers; want once: %s", n, logged.String())
	}
}

// TestTheExecutablesPagesAreReleasedWhileStartingUntilStopped: while the start's releases run,
// the executable's pages that a test maps again are released within a few periods; once Stop
// has returned, pages mapped again stay mapped; and the releases' log line says why they ended.
func TestTheExecutablesPagesAreReleasedWhileStartingUntilStopped(t *testing.T) {
	var logged bytes.Buffer
	const period = 10 * time.Millisecond
	r := releaseWhileStarting(t.Context(), slog.New(slog.NewTextHandler(&logged, nil)), period, 4<<20, time.Hour)
	for range 3 {
		size := touchExecutable(t)
		deadline := time.Now().Add(10 * time.Second)
		for residentFileBacked() >= size/4 {
			if time.Now().After(deadline) {
				t.Fatalf("RssFile %d KiB 10 s after the executable's %d KiB were mapped again; want less than a quarter", residentFileBacked()>>10, size>>10)
			}
			time.Sleep(period)
		}
	}
	r.Stop()
	size := touchExecutable(t)
	time.Sleep(10 * period) // ten periods without a release
	if now := residentFileBacked(); now < size/2 {
		t.Errorf("RssFile %d KiB ten periods after Stop returned and the executable's %d KiB were mapped again: released after Stop", now>>10, size>>10)
	}
	if !strings.Contains(logged.String(), "why=\"the start is over\"") {
		t.Errorf("the releases' log: %q; want the line saying the start is over", logged.String())
	}
	r.Stop() // a second Stop returns too
}

// TestTheReleasesWhileStartingEndAfterTheirBound: releases that nobody stops end once their
// bound has passed, and say so.
func TestTheReleasesWhileStartingEndAfterTheirBound(t *testing.T) {
	var logged bytes.Buffer
	r := releaseWhileStarting(t.Context(), slog.New(slog.NewTextHandler(&logged, nil)), 10*time.Millisecond, 4<<20, 50*time.Millisecond)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the releases went on 10 s after their bound of 50ms")
	}
	if !strings.Contains(logged.String(), "longer than 50ms") {
		t.Errorf("the releases' log: %q; want the line saying the start lasted longer than the bound", logged.String())
	}
}

// TestTheReleasesWhileStartingLeaveAloneWhatRunningKeepsMapped: with nothing new touched, the
// pages running maps again after a release are not released again and again (that the pages
// a start maps are released is TestTheExecutablesPagesAreReleasedWhileStartingUntilStopped).
func TestTheReleasesWhileStartingLeaveAloneWhatRunningKeepsMapped(t *testing.T) {
	var logged bytes.Buffer
	const period = 10 * time.Millisecond
	r := releaseWhileStarting(t.Context(), slog.New(slog.NewTextHandler(&logged, nil)), period, 8<<20, time.Hour)
	time.Sleep(50 * period) // fifty periods of running without touching anything new
	r.Stop()
	_, after, _ := strings.Cut(logged.String(), "releases=")
	releases, err := strconv.Atoi(strings.Fields(after + " ")[0])
	if err != nil {
		t.Fatalf("the releases' log: %q: %v", logged.String(), err)
	}
	// One at the start if the test binary's pages were 8 MiB or more by then.
	if releases > 1 {
		t.Errorf("%d releases in 50 periods of running that touched nothing new; want at most 1 (%s)", releases, logged.String())
	}
}
