package app

import (
	"slices"
	"strconv"
	"strings"
)

// The Go runtime's system monitor (sysmon) is a thread of its own that, while any goroutine
// runs, wakes every 20 µs to take processors back from system calls and preempt long-running
// goroutines; after 1 ms without finding anything to do it doubles its sleep, up to 10 ms.
// When every processor is idle it sleeps until woken, and the next system call that wakes it
// starts it again at 20 µs. dynwatch at 300 events a second is that pattern exactly: each
// event is a few hundred µs of work (a watch read, a commit, a request per sink) between idle
// stretches, so the monitor woke every 20 µs through all of it. Measured with perf at 10,000
// configmaps, 300 updates a second and two webhooks, runtime.sysmon was 17% of dynwatch's CPU
// (its sleeps' context switches), which Go's own profiler does not see; never letting it sleep
// until woken, so that it keeps its backed-off pace, took CPU per update from 1.02–1.07x a
// bare informer's to 0.80–0.86x (docs/benchmarks-history.md, "The runtime's system monitor at
// its idle pace").
//
// The runtime has no setting for the monitor's pace; the one way to keep it from the sleep
// that resets it is GODEBUG's schedtrace, whose scheduler summary it then writes every
// schedtrace milliseconds, measured from the machine's boot. main runs dynwatch again (the
// same process, execve) with schedtrace at its largest, sysmonSchedtrace: about 24.8 days
// between summaries, and one at start on a machine up longer than that. A GODEBUG that names
// schedtrace already (schedtrace=0 restores Go's default) is left alone, and so is everything
// else GODEBUG says.

// sysmonSchedtrace is the schedtrace dynwatch runs with: the largest the runtime takes (an
// int32 of milliseconds).
const sysmonSchedtrace = 1<<31 - 1

// RuntimeEnvironment is environ (os.Environ's form) with GODEBUG's schedtrace set to
// sysmonSchedtrace, and true; or environ and false when its GODEBUG names schedtrace already,
// whatever its value.
func RuntimeEnvironment(environ []string) ([]string, bool) {
	const key = "GODEBUG="
	at := slices.IndexFunc(environ, func(kv string) bool { return strings.HasPrefix(kv, key) }) // the first, as the runtime reads it
	godebug := ""
	if at >= 0 {
		godebug = environ[at][len(key):]
	}
	for setting := range strings.SplitSeq(godebug, ",") {
		if name, _, _ := strings.Cut(setting, "="); strings.TrimSpace(name) == "schedtrace" {
			return environ, false
		}
	}
	ours := key + "schedtrace=" + strconv.Itoa(sysmonSchedtrace)
	if at < 0 {
		return append(slices.Clone(environ), ours), true
	}
	if godebug != "" {
		ours = environ[at] + ",schedtrace=" + strconv.Itoa(sysmonSchedtrace)
	}
	env := slices.Clone(environ)
	env[at] = ours
	return env, true
}
