package config

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
)

// settleTime gathers the bursts of file events one save makes into one reload.
const settleTime = 250 * time.Millisecond

// ReloaderOptions are a Reloader's dependencies.
type ReloaderOptions struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Path is the configuration file; Current is what was loaded from it at start.
	Path    string
	Current *Config
	// Signals asks for a reload (SIGHUP): main turns the signal into this channel.
	Signals <-chan os.Signal
	// Apply puts a valid new configuration into effect. An error rejects it.
	Apply func(*Config) error
}

// ReloadStatus is the outcome of the last reload, as /status reports it.
type ReloadStatus struct {
	Time    *time.Time `json:"time,omitempty"` // nil: no reload yet
	Success bool       `json:"success"`
	Error   string     `json:"error,omitempty"`
	// RestartRequired names changed settings that only a restart applies.
	RestartRequired []string `json:"restartRequired,omitempty"`
}

// Reloader loads the configuration again when its file changes or a signal arrives, and
// applies it if it is valid. It watches the file's directory, so that it also sees a
// Kubernetes ConfigMap volume update, which swaps a symlink rather than writing the file; and
// the directories of the files credentials are read from (bearer tokens, signing secrets, TLS
// files), so that a rotated Secret takes effect without a signal.
type Reloader struct {
	ReloaderOptions
	reloads *prometheus.CounterVec
	last    prometheus.Gauge

	// Owned by Run's goroutine.
	watcher *fsnotify.Watcher
	dirs    map[string]bool // directories watched
	files   map[string]bool // files whose change triggers a reload

	mu     sync.Mutex
	status ReloadStatus
}

// NewReloader builds a Reloader and registers its metrics. Nothing is watched until Run.
func NewReloader(o ReloaderOptions) (*Reloader, error) {
	r := &Reloader{
		ReloaderOptions: o,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynwatch_config_reloads_total",
			Help: "Configuration reloads, by result: success, or failure (the running configuration stays).",
		}, []string{"result"}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dynwatch_config_last_reload_successful",
			Help: "1 when the last configuration reload succeeded or none was tried, 0 when it failed.",
		}),
		status: ReloadStatus{Success: true},
	}
	r.reloads.WithLabelValues("success")
	r.reloads.WithLabelValues("failure")
	r.last.Set(1)
	for _, c := range []prometheus.Collector{r.reloads, r.last} {
		if err := o.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("register reload metrics: %w", err)
		}
	}
	return r, nil
}

// Status returns the outcome of the last reload.
func (r *Reloader) Status() ReloadStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// Run watches until ctx ends.
func (r *Reloader) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch config: %w", err)
	}
	// Closing only releases the watch descriptors: a failure leaves nothing to do.
	defer func() { _ = w.Close() }()
	r.watcher, r.dirs, r.files = w, map[string]bool{}, map[string]bool{}
	if err := r.watch(r.Path); err != nil {
		return fmt.Errorf("watch config directory: %w", err)
	}
	r.watchSecrets(r.Current)
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.Signals:
			r.reload("signal")
		case ev := <-w.Events:
			// A watched file itself, or ..data: the symlink a ConfigMap or Secret volume swaps.
			if r.files[filepath.Clean(ev.Name)] || filepath.Base(ev.Name) == "..data" {
				settle.Reset(settleTime)
			}
		case err := <-w.Errors:
			r.Logger.Warn("config file watch error", "err", err)
		case <-settle.C:
			r.reload("file changed")
		}
	}
}

// watch adds file's directory to the watcher, and file to those that trigger a reload.
func (r *Reloader) watch(file string) error {
	file = filepath.Clean(file)
	r.files[file] = true
	dir := filepath.Dir(file)
	if r.dirs[dir] {
		return nil
	}
	if err := r.watcher.Add(dir); err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	r.dirs[dir] = true
	return nil
}

// watchSecrets watches the credential files c reads.
func (r *Reloader) watchSecrets(c *Config) {
	for _, f := range c.SecretFiles() {
		if err := r.watch(f); err != nil {
			r.Logger.Warn("cannot watch a credential file: a change to it needs SIGHUP", "err", err)
		}
	}
}

func (r *Reloader) reload(cause string) {
	next, err := Load(r.Path)
	if err == nil {
		err = r.Apply(next)
	}
	if err == nil && r.watcher != nil {
		r.watchSecrets(next)
	}
	now := time.Now().UTC()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status = ReloadStatus{Time: &now, Success: err == nil}
	if err != nil {
		r.status.Error = err.Error()
		r.reloads.WithLabelValues("failure").Inc()
		r.last.Set(0)
		r.Logger.Error("configuration reload rejected: the running configuration stays", "cause", cause, "err", err)
		return
	}
	r.status.RestartRequired = r.Current.Unreloadable(next)
	r.reloads.WithLabelValues("success").Inc()
	r.last.Set(1)
	if len(r.status.RestartRequired) > 0 {
		r.Logger.Warn("configuration reloaded; some changed settings apply only after a restart", "cause", cause, "restartRequired", r.status.RestartRequired)
		return
	}
	r.Logger.Info("configuration reloaded", "cause", cause, "resources", len(next.Resources), "webhooks", len(next.Webhooks), "jetstream", len(next.JetStream), "kafka", len(next.Kafka))
}
