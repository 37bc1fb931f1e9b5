package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// helperEnv makes the test binary a stand-in for dynwatch's start: TestMain then runs
// execWithRuntimeEnvironment, as main does, and prints the GODEBUG it ended up with.
const helperEnv = "DYNWATCH_TEST_MAIN_START"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		execWithRuntimeEnvironment()
		if _, err := os.Stdout.WriteString("GODEBUG=" + os.Getenv("GODEBUG") + "\n"); err != nil {
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestDynwatchStartsAgainWithTheSystemMonitorAtItsIdlePace: a process started without
// schedtrace in GODEBUG runs on with it (the runtime reads it as it starts, so only the
// process started again has it), keeping what GODEBUG said; one whose GODEBUG names schedtrace
// keeps it as it was.
func TestDynwatchStartsAgainWithTheSystemMonitorAtItsIdlePace(t *testing.T) {
	for _, tc := range []struct{ name, godebug, want string }{
		{"without GODEBUG", "", "GODEBUG=schedtrace=2147483647"},
		{"with another setting", "http2client=0", "GODEBUG=http2client=0,schedtrace=2147483647"},
		{"with schedtrace=0, Go's default", "schedtrace=0", "GODEBUG=schedtrace=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
			cmd.Env = slices.DeleteFunc(append(os.Environ(), helperEnv+"=1"), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") })
			if tc.godebug != "" {
				cmd.Env = append(cmd.Env, "GODEBUG="+tc.godebug)
			}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if got := strings.TrimSpace(string(out)); got != tc.want {
				t.Errorf("the process started with GODEBUG %q ran with %q; want %q", tc.godebug, got, tc.want)
			}
		})
	}
}
