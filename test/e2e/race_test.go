package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dynwatch/dynwatch/test/runner"
)

// plantedRace is a file added to package main by an overlay: two goroutines that write one
// variable without synchronisation, from the process's start.
const plantedRace = `package main

import "time"

var planted int

func init() {
	for range 2 {
		go func() {
			for {
				planted++
				time.Sleep(time.Millisecond)
			}
		}()
	}
}
`

// TestARaceInTheBinaryFailsTheTestThatStartedIt builds dynwatch with the race detector and a
// data race planted (an overlay adds plantedRace to package main) and runs it as every
// end-to-end test runs dynwatch: the check supervise makes when a test ends fails it, naming
// the process, whether it was stopped or SIGKILLed; and the same check passes the binary the
// other tests run, stopped or killed alike.
func TestARaceInTheBinaryFailsTheTestThatStartedIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	plant := filepath.Join(dir, "planted.go")
	writeFile(t, plant, plantedRace)
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(runner.Root(t), "race_planted_test_overlay.go"): plant}})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "overlay.json"), string(overlay))
	racy, err := runner.Build(t.Context(), dir, true, "-overlay", filepath.Join(dir, "overlay.json"))
	if err != nil {
		t.Fatal(err)
	}
	ns := namespace(t)
	config := filepath.Join(dir, "config.yaml")
	writeFile(t, config, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns))
	for _, tt := range []struct {
		name   string
		binary string
		kill   bool
		racy   bool
	}{
		{"planted, stopped", racy, false, true},
		{"planted, SIGKILLed", racy, true, true},
		{"clean, stopped", dynwatchBinary(t), false, false},
		{"clean, SIGKILLed", dynwatchBinary(t), true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, err := runner.Start(runner.Options{Binary: tt.binary, Config: config, Kubeconfig: cluster.Kubeconfig})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Kill() })
			if err := p.WaitReady(t.Context()); err != nil {
				t.Fatal(err)
			}
			if tt.racy {
				if _, err := p.WaitLog(t.Context(), "WARNING: DATA RACE"); err != nil {
					t.Fatal(err)
				}
			}
			if tt.kill {
				if err := p.Kill(); err != nil {
					t.Fatal(err)
				}
			} else {
				_ = p.Stop(stopTimeout)
			}
			err = p.Check()
			switch {
			case tt.racy && err == nil:
				t.Fatalf("the check passed a process that reported a data race; its log:\n%s", p.Log())
			case tt.racy && (!strings.Contains(err.Error(), "data race") || !strings.Contains(err.Error(), p.Name()) || !strings.Contains(err.Error(), "planted")):
				t.Errorf("the check's error does not name the race, the process %s and the racing code:\n%v", p.Name(), err)
			case !tt.racy && err != nil:
				t.Errorf("the check failed the binary every other test runs: %v", err)
			}
		})
	}
}
