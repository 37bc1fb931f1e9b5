// Command validate validates again the records of failed runs (validate.Record, written by
// TestRobustness and the history tests): it prints every violation each record holds, and
// exits 1 if any does, 2 if a record cannot be read.
//
//	go run ./test/validate/cmd/validate $TMPDIR/dynwatch-robustness-<seed>.json
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/dynwatch/dynwatch/test/validate"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run validates the records at paths, printing to out, and returns the exit status.
func run(paths []string, out, errs io.Writer) int {
	if len(paths) == 0 {
		fmt.Fprintln(errs, "usage: validate RECORD.json...")
		return 2
	}
	code := 0
	for _, path := range paths {
		r, err := validate.ReadRecord(path)
		if err != nil {
			fmt.Fprintln(errs, err)
			return 2
		}
		v := r.Violations()
		fmt.Fprintf(out, "%s: seed %d, fault %q: %d changes, %d streams, %d lists, %d sinks: %d violations\n",
			path, r.Seed, r.Fault, len(r.History), len(r.Streams), len(r.Lists), len(r.Sinks), len(v))
		for _, x := range v {
			fmt.Fprintln(out, "  "+x.String())
		}
		if len(v) > 0 {
			code = 1
		}
	}
	return code
}
