package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Prometheus is a Prometheus server (PrometheusVersion) on 127.0.0.1, with its data in a
// directory of its own.
type Prometheus struct {
	// URL is the server's base URL, http://127.0.0.1:port.
	URL  string
	dir  string
	proc *process
}

// StartPrometheus runs the test bed's Prometheus in dir with config, the text of a
// prometheus.yml (rule files it names are read relative to dir), and waits until it is ready.
// Stop it with Stop.
func StartPrometheus(ctx context.Context, bins Binaries, dir, config string) (*Prometheus, error) {
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := startProcess("prometheus", bins.Prometheus, filepath.Join(dir, "prometheus.log"),
		"--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	if err != nil {
		return nil, err
	}
	prom := &Prometheus{URL: "http://" + addr, dir: dir, proc: p}
	for {
		if err := p.exited(); err != nil {
			return nil, fmt.Errorf("%w\n%s", err, prom.Log())
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, prom.URL+"/-/ready", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close() // the status is all that is read
			if resp.StatusCode == http.StatusOK {
				return prom, nil
			}
		}
		select {
		case <-ctx.Done():
			prom.Stop()
			return nil, fmt.Errorf("prometheus not ready: %w\n%s", ctx.Err(), prom.Log())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Alert is one alert as Prometheus' /api/v1/alerts lists it.
type Alert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"` // pending or firing
	Value  string            `json:"value"`
}

// Alerts returns the alerts Prometheus holds now, pending and firing.
func (p *Prometheus) Alerts(ctx context.Context) ([]Alert, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/api/v1/alerts", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }() // read to the end below
	var body struct {
		Status string `json:"status"`
		Data   struct {
			Alerts []Alert `json:"alerts"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("decode /api/v1/alerts: %w", err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("/api/v1/alerts: status %q", body.Status)
	}
	return body.Data.Alerts, nil
}

// Log returns Prometheus' log.
func (p *Prometheus) Log() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, "prometheus.log"))
	return string(b)
}

// Stop stops Prometheus.
func (p *Prometheus) Stop() { p.proc.stop(10 * time.Second) }
