package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/dynwatch/dynwatch/test/validate"
)

func TestARecordsViolationsArePrintedAndSetTheExitStatus(t *testing.T) {
	dir := t.TempDir()
	history := validate.History{{Type: validate.Added, Key: "ns/a", Revision: 10}, {Type: validate.Modified, Key: "ns/a", Revision: 11}}
	kept := validate.Record{Seed: 1, History: history, Streams: []validate.Stream{{Name: "w", From: 9, Events: history}}}
	broken := kept
	broken.Streams = []validate.Stream{{Name: "w", From: 9, Events: history[1:]}} // ADDED ns/a 10 lost
	for name, r := range map[string]validate.Record{"kept.json": kept, "broken.json": broken} {
		if err := r.Write(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		paths []string
		code  int
		out   string
	}{
		{[]string{"kept.json"}, 0, "0 violations"},
		{[]string{"kept.json", "broken.json"}, 1, "Resumable: w, event 0: MODIFIED ns/a 11 where ADDED ns/a 10 was due"},
		{[]string{"missing.json"}, 2, ""},
		{nil, 2, ""},
	} {
		var paths []string
		for _, p := range tt.paths {
			paths = append(paths, filepath.Join(dir, p))
		}
		var out, errs strings.Builder
		if code := run(paths, &out, &errs); code != tt.code || !strings.Contains(out.String(), tt.out) {
			t.Errorf("validate %v: exit %d, output %q, errors %q; want exit %d and %q", tt.paths, code, out.String(), errs.String(), tt.code, tt.out)
		}
	}
}
