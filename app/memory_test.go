package app

import (
	"log/slog"
	"os"
	"runtime/debug"
	"testing"
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
