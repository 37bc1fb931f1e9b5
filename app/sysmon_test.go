package app

import (
	"slices"
	"testing"
)

// TestRuntimeEnvironmentAddsSchedtraceUnlessGODEBUGNamesIt: schedtrace is added to the GODEBUG
// the runtime reads (the first), keeping its other settings and every other variable; a
// GODEBUG that names schedtrace, whatever its value, leaves the environment as it is; the
// caller's slice is never changed.
func TestRuntimeEnvironmentAddsSchedtraceUnlessGODEBUGNamesIt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		environ []string
		want    []string
		changed bool
	}{
		{"no GODEBUG", []string{"HOME=/", "PATH=/bin"}, []string{"HOME=/", "PATH=/bin", "GODEBUG=schedtrace=2147483647"}, true},
		{"an empty GODEBUG", []string{"GODEBUG=", "HOME=/"}, []string{"GODEBUG=schedtrace=2147483647", "HOME=/"}, true},
		{"other settings", []string{"GODEBUG=madvdontneed=1,http2client=0"}, []string{"GODEBUG=madvdontneed=1,http2client=0,schedtrace=2147483647"}, true},
		{"schedtrace=0, Go's default", []string{"GODEBUG=http2client=0, schedtrace=0"}, []string{"GODEBUG=http2client=0, schedtrace=0"}, false},
		{"schedtrace of its own", []string{"GODEBUG=schedtrace=1000,scheddetail=1"}, []string{"GODEBUG=schedtrace=1000,scheddetail=1"}, false},
		{"two GODEBUGs: the runtime reads the first", []string{"GODEBUG=gctrace=1", "GODEBUG=schedtrace=0"}, []string{"GODEBUG=gctrace=1,schedtrace=2147483647", "GODEBUG=schedtrace=0"}, true},
		{"a setting whose name only ends in schedtrace", []string{"GODEBUG=xschedtrace=1"}, []string{"GODEBUG=xschedtrace=1,schedtrace=2147483647"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := slices.Clone(tc.environ)
			got, changed := RuntimeEnvironment(tc.environ)
			if !slices.Equal(got, tc.want) || changed != tc.changed {
				t.Errorf("RuntimeEnvironment(%q) = %q, %v; want %q, %v", tc.environ, got, changed, tc.want, tc.changed)
			}
			if !slices.Equal(tc.environ, before) {
				t.Errorf("the caller's environment changed: %q, was %q", tc.environ, before)
			}
		})
	}
}
