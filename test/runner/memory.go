package runner

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Resident is a process's resident memory as its memory limit sees it, file-backed mappings
// included, in bytes: now (VmRSS), split into anonymous (RssAnon) and file-backed (RssFile),
// and the peak since it started (VmHWM).
type Resident struct{ Now, Anon, File, Peak uint64 }

// ResidentMemory reads process pid's resident memory from /proc/pid/status; zero where it
// cannot.
func ResidentMemory(pid int) Resident {
	var r Resident
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return r
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		name, value, _ := strings.Cut(line, ":")
		kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		switch name {
		case "VmRSS":
			r.Now = kb << 10
		case "VmHWM":
			r.Peak = kb << 10
		case "RssAnon":
			r.Anon = kb << 10
		case "RssFile":
			r.File = kb << 10
		}
	}
	return r
}
