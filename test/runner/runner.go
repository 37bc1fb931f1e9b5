// Package runner builds the dynwatch binary and runs it as a child process, for end-to-end
// tests, the demo and benchmarks. A Process learns the addresses its servers bound (configure
// port 0) from the "listening" lines of dynwatch's JSON log, keeps the whole log for failure
// reports, and dies with the parent process. Methods are safe for concurrent use.
package runner

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dynwatch/dynwatch/httpapi"
)

// ModuleRoot is the directory of dynwatch's go.mod, found from this source file.
func ModuleRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("locate module root: no caller information")
	}
	return filepath.Join(filepath.Dir(file), "..", ".."), nil
}

// Root is ModuleRoot for a test, which fails when it cannot be found.
func Root(t testing.TB) string {
	t.Helper()
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// Build compiles dynwatch (with the race detector when race is true, and any further go build
// flags) into dir and returns the binary's path. Without the race detector it builds as the
// Dockerfile's build stage does (CGO_ENABLED=0, -trimpath): the binary tested is the one shipped,
// and its packages compile once for the tests and the image's replayed build (test/image).
func Build(ctx context.Context, dir string, race bool, flags ...string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	return build(ctx, root, dir, race, flags...)
}

// build compiles the dynwatch module in src into dir, as Build says.
func build(ctx context.Context, src, dir string, race bool, flags ...string) (string, error) {
	bin := filepath.Join(dir, "dynwatch")
	args := []string{"build", "-o", bin}
	env := os.Environ()
	if race {
		args = append(args, "-race")
	} else {
		args = append(args, "-trimpath")
		env = append(env, "CGO_ENABLED=0")
	}
	args = append(args, flags...)
	cmd := exec.CommandContext(ctx, "go", append(args, ".")...)
	cmd.Dir = src
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build dynwatch: %w\n%s", err, out)
	}
	return bin, nil
}

// Options say how to run dynwatch.
type Options struct {
	Binary     string
	Config     string    // --config
	Kubeconfig string    // --kubeconfig
	Env        []string  // added to the environment
	Log        io.Writer // receives dynwatch's log lines as they come, if set
	// APIClient makes Status's request: one that trusts the API's CA and sends a token, when
	// the API serves TLS and authenticates. http.DefaultClient when nil.
	APIClient *http.Client
	// Cgroup is a cgroup directory (v1 or v2) the process starts in, so that it runs under
	// that cgroup's limits from its first instruction; empty: the parent's.
	Cgroup string
	// BreaksCaches says the test changes caches behind their informers' back on purpose:
	// Check does not hold it against the process that a consistency check found one differing.
	BreaksCaches bool
}

// inconsistent is what dynwatch logs when a consistency check finds a cache differing from the
// apiserver.
const inconsistent = "the cache differs from the apiserver"

// Process is a running dynwatch.
type Process struct {
	cmd       *exec.Cmd
	config    string
	out       io.Writer
	apiClient *http.Client
	done      chan struct{}
	// breaksCaches: see Options.BreaksCaches.
	breaksCaches bool

	mu      sync.Mutex
	log     strings.Builder
	addrs   map[string]string // server name → its base URL
	waitErr error
	changed chan struct{} // closed and replaced whenever the log grows
	races   []string      // the race detector's reports, as they came
	race    []string      // the lines of the report being read
	killed  bool          // Kill was called
	stopErr error         // what Stop found
}

// The race detector's report starts with raceStart and ends with raceEnd.
const (
	raceStart = "WARNING: DATA RACE"
	raceEnd   = "=================="
)

// Start starts dynwatch. It does not wait for anything; see WaitListening and WaitReady.
func Start(o Options) (*Process, error) {
	args := []string{"--config", o.Config}
	if o.Kubeconfig != "" {
		args = append(args, "--kubeconfig", o.Kubeconfig)
	}
	cmd := exec.Command(o.Binary, args...)
	if o.Cgroup != "" {
		// A shell moves itself into the cgroup, then becomes dynwatch (same process).
		cmd = exec.Command("/bin/sh", append([]string{"-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, o.Cgroup, o.Binary}, args...)...)
	}
	cmd.Env = append(os.Environ(), o.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start dynwatch: %w", err)
	}
	client := o.APIClient
	if client == nil {
		client = http.DefaultClient
	}
	p := &Process{cmd: cmd, config: o.Config, out: o.Log, apiClient: client, breaksCaches: o.BreaksCaches, done: make(chan struct{}), addrs: map[string]string{}, changed: make(chan struct{})}
	go p.read(stderr)
	return p, nil
}

func (p *Process) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		var entry struct{ Msg, Server, Address, Scheme string }
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "listening" {
			p.mu.Lock()
			p.addrs[entry.Server] = entry.Scheme + "://" + entry.Address
			p.mu.Unlock()
		}
		if p.out != nil {
			fmt.Fprintln(p.out, line)
		}
		p.mu.Lock()
		p.log.WriteString(line + "\n")
		p.readRace(line)
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}
	err := p.cmd.Wait()
	p.mu.Lock()
	p.waitErr = err
	p.mu.Unlock()
	close(p.done)
}

// readRace collects the race detector's reports from the log's lines.
func (p *Process) readRace(line string) {
	switch {
	case strings.Contains(line, raceStart):
		p.race = []string{line}
	case p.race != nil && strings.HasPrefix(line, raceEnd):
		p.races = append(p.races, strings.Join(p.race, "\n"))
		p.race = nil
	case p.race != nil:
		p.race = append(p.race, line)
	}
}

// Races returns the data races the race detector has reported so far. It prints each as it
// finds it, so a process killed later has reported the races found before.
func (p *Process) Races() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.race != nil { // a report cut short by the process's end
		return append(slices.Clone(p.races), strings.Join(p.race, "\n"))
	}
	return slices.Clone(p.races)
}

// Name names the process in a failure: its PID and configuration file.
func (p *Process) Name() string {
	return fmt.Sprintf("dynwatch (pid %d, config %s)", p.PID(), p.config)
}

// Check returns what a test that ran the process must fail for, once it has exited: every
// data race in its log, every cache a consistency check found differing from the apiserver
// (unless Options.BreaksCaches), and an exit status other than 0 that no Kill asked for (after
// Stop, Stop's error, with the goroutines of a process that did not stop). It names the
// process.
func (p *Process) Check() error {
	var errs []error
	for _, r := range p.Races() {
		errs = append(errs, fmt.Errorf("%s: data race:\n%s", p.Name(), r))
	}
	if !p.breaksCaches {
		for line := range strings.Lines(p.Log()) {
			if strings.Contains(line, inconsistent) {
				errs = append(errs, fmt.Errorf("%s: a consistency check found a cache differing from the apiserver:\n%s", p.Name(), line))
			}
		}
	}
	p.mu.Lock()
	killed, stopErr, waitErr := p.killed, p.stopErr, p.waitErr
	p.mu.Unlock()
	switch {
	case killed:
	case stopErr != nil:
		errs = append(errs, fmt.Errorf("%s: %w", p.Name(), stopErr))
	case waitErr != nil:
		errs = append(errs, fmt.Errorf("%s exited by itself: %w", p.Name(), waitErr))
	}
	return errors.Join(errs...)
}

// Kill sends SIGKILL and waits for the process to exit: the exit is the caller's, and Check
// does not hold it against the process.
func (p *Process) Kill() error {
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-p.done
	return nil
}

// Log returns everything dynwatch has logged so far.
func (p *Process) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// WaitLog waits until dynwatch has logged a line containing s, and returns that line.
func (p *Process) WaitLog(ctx context.Context, s string) (string, error) {
	for {
		p.mu.Lock()
		log, changed := p.log.String(), p.changed
		p.mu.Unlock()
		for line := range strings.SplitSeq(log, "\n") {
			if strings.Contains(line, s) {
				return line, nil
			}
		}
		select {
		case <-changed:
		case <-p.done:
			return "", fmt.Errorf("dynwatch exited (%w) before logging %q", p.exitReason(), s)
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for dynwatch to log %q: %w", s, ctx.Err())
		}
	}
}

// exitReason is how the process ended, for an error message: its exit error, or exit status 0.
func (p *Process) exitReason() error {
	if err := p.ExitErr(); err != nil {
		return err
	}
	return errors.New("exit status 0")
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitErr is the error from waiting for the process; nil if it exited 0 or still runs.
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// WaitListening waits until both servers have logged their addresses, and returns the base
// URLs of the API and the metrics servers.
func (p *Process) WaitListening(ctx context.Context) (api, metrics string, err error) {
	for _, server := range []string{"api", "metrics"} {
		if _, err := p.WaitLog(ctx, `"server":"`+server+`"`); err != nil {
			return "", "", err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addrs["api"], p.addrs["metrics"], nil
}

// WaitReady waits until /readyz on the metrics server answers 200.
func (p *Process) WaitReady(ctx context.Context) error {
	_, metrics, err := p.WaitListening(ctx)
	if err != nil {
		return err
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := http.Get(metrics + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-tick.C:
		case <-p.done:
			return fmt.Errorf("dynwatch exited (%w) before it was ready", p.exitReason())
		case <-ctx.Done():
			return fmt.Errorf("waiting for dynwatch to be ready: %w", ctx.Err())
		}
	}
}

// Status fetches and decodes GET /status.
func (p *Process) Status(ctx context.Context) (httpapi.StatusResponse, error) {
	var s httpapi.StatusResponse
	api, _, err := p.WaitListening(ctx)
	if err != nil {
		return s, err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, api+"/status", nil)
	resp, err := p.apiClient.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return s, fmt.Errorf("GET /status: %s: %s", resp.Status, b)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// PID is the process's id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends SIGTERM and waits up to timeout for the process to exit. After that it sends
// SIGQUIT, and kills it if it is still running 10 s later. It returns the exit error (nil for
// exit code 0), or an error saying it did not stop, with the goroutines SIGQUIT printed.
func (p *Process) Stop(timeout time.Duration) error {
	err := p.stop(timeout)
	p.mu.Lock()
	if p.stopErr == nil {
		p.stopErr = err
	}
	p.mu.Unlock()
	return err
}

func (p *Process) stop(timeout time.Duration) error {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.ExitErr()
	case <-time.After(timeout):
	}
	// The Go runtime answers SIGQUIT by printing every goroutine's stack and exiting: what the
	// stop was waiting for.
	_ = p.Signal(syscall.SIGQUIT)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	log := p.Log()
	if i := strings.Index(log, "SIGQUIT: quit"); i >= 0 {
		return fmt.Errorf("dynwatch did not exit within %s of SIGTERM; its goroutines on SIGQUIT:\n%s", timeout, log[i:])
	}
	return fmt.Errorf("dynwatch did not exit within %s of SIGTERM; killed", timeout)
}
