package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// NATS is a cluster of nats-server processes (NATSServerVersion) on 127.0.0.1 with JetStream
// enabled, each with its own store directory, joined by routes. A server can be killed and
// started again on the same ports and store.
type NATS struct {
	bins    Binaries
	dir     string
	mu      sync.Mutex
	servers []*natsServer
}

type natsServer struct {
	name                    string
	client, cluster, health int
	syncAlways              bool // jetstream.sync_interval: always, from the server's next start
	proc                    *process
}

// StartNATS starts n servers in dir and returns once every one of them reports JetStream
// healthy. Stop them with Stop.
func StartNATS(ctx context.Context, bins Binaries, dir string, n int) (*NATS, error) {
	c := &NATS{bins: bins, dir: dir}
	for i := range n {
		s := &natsServer{name: "n" + strconv.Itoa(i+1)}
		for _, port := range []*int{&s.client, &s.cluster, &s.health} {
			p, err := FreePort()
			if err != nil {
				return nil, err
			}
			*port = p
		}
		c.servers = append(c.servers, s)
	}
	for i := range c.servers {
		if err := c.start(i); err != nil {
			c.Stop()
			return nil, err
		}
	}
	for i := range c.servers {
		if err := c.waitHealthy(ctx, i); err != nil {
			c.Stop()
			return nil, err
		}
	}
	return c, nil
}

// config is server i's configuration file.
func (c *NATS) config(i int) string {
	s := c.servers[i]
	var routes []string
	for _, o := range c.servers {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.cluster))
	}
	cluster := ""
	if len(c.servers) > 1 {
		cluster = fmt.Sprintf("cluster {\n  name: testbed\n  listen: 127.0.0.1:%d\n  routes: [%s]\n}\n", s.cluster, strings.Join(routes, ", "))
	}
	c.mu.Lock()
	always := s.syncAlways
	c.mu.Unlock()
	sync := ""
	if always {
		sync = "  sync_interval: always\n"
	}
	return fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
jetstream {
  store_dir: %q
  max_memory_store: 64MB
  max_file_store: 1GB
%s}
%s`, s.name, s.client, s.health, filepath.Join(c.dir, s.name), sync, cluster)
}

func (c *NATS) start(i int) error {
	s := c.servers[i]
	path := filepath.Join(c.dir, s.name+".conf")
	if err := os.WriteFile(path, []byte(c.config(i)), 0o600); err != nil {
		return err
	}
	p, err := startProcess("nats-server "+s.name, c.bins.NATSServer, filepath.Join(c.dir, s.name+".log"), "-c", path)
	if err != nil {
		return err
	}
	c.mu.Lock()
	s.proc = p
	c.mu.Unlock()
	return nil
}

// waitHealthy waits until server i answers /healthz with 200: JetStream is up and current.
func (c *NATS) waitHealthy(ctx context.Context, i int) error {
	s := c.servers[i]
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", s.health)
	for {
		if err := s.proc.exited(); err != nil {
			return fmt.Errorf("%w\n%s", err, c.Log(i))
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close() // the status is all that is read
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nats-server %s not healthy: %w\n%s", s.name, ctx.Err(), c.Log(i))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// URLs are the servers' client URLs, nats://127.0.0.1:port.
func (c *NATS) URLs() []string {
	var out []string
	for _, s := range c.servers {
		out = append(out, fmt.Sprintf("nats://127.0.0.1:%d", s.client))
	}
	return out
}

// PIDs are the running servers' process ids.
func (c *NATS) PIDs() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for _, s := range c.servers {
		if s.proc != nil && s.proc.exited() == nil {
			out = append(out, s.proc.cmd.Process.Pid)
		}
	}
	return out
}

// SyncAlways sets whether server i syncs every write to disk before it acknowledges it
// (jetstream.sync_interval: always) from its next start; by default it syncs every 2 minutes.
func (c *NATS) SyncAlways(i int, always bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.servers[i].syncAlways = always
}

// MonitorURLs are the servers' monitoring endpoints, http://127.0.0.1:port (/varz, /healthz).
func (c *NATS) MonitorURLs() []string {
	var out []string
	for _, s := range c.servers {
		out = append(out, fmt.Sprintf("http://127.0.0.1:%d", s.health))
	}
	return out
}

// Kill sends server i SIGKILL and waits for it to exit.
func (c *NATS) Kill(i int) {
	c.mu.Lock()
	p := c.servers[i].proc
	c.mu.Unlock()
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Restart starts server i again, on its ports and store, and waits until it is healthy.
func (c *NATS) Restart(ctx context.Context, i int) error {
	if err := c.start(i); err != nil {
		return err
	}
	return c.waitHealthy(ctx, i)
}

// Index is the index of the server named name (n1 is 0), -1 for none.
func (c *NATS) Index(name string) int {
	for i, s := range c.servers {
		if s.name == name {
			return i
		}
	}
	return -1
}

// Connected is the index of the running server that holds a client connection named name,
// as its monitoring endpoint /connz reports, or an error if none does.
func (c *NATS) Connected(ctx context.Context, name string) (int, error) {
	for i, s := range c.servers {
		c.mu.Lock()
		running := s.proc != nil && s.proc.exited() == nil
		c.mu.Unlock()
		if !running {
			continue
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/connz?limit=4096", s.health), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return -1, fmt.Errorf("nats-server %s /connz: %w", s.name, err)
		}
		var connz struct {
			Connections []struct{ Name string } `json:"connections"`
		}
		err = json.NewDecoder(resp.Body).Decode(&connz)
		_ = resp.Body.Close() // read whole or failed: either way done with
		if err != nil {
			return -1, fmt.Errorf("nats-server %s /connz: %w", s.name, err)
		}
		for _, conn := range connz.Connections {
			if conn.Name == name {
				return i, nil
			}
		}
	}
	return -1, fmt.Errorf("no running nats-server holds a connection named %q", name)
}

// Log returns the tail of server i's log.
func (c *NATS) Log(i int) string {
	b, _ := os.ReadFile(filepath.Join(c.dir, c.servers[i].name+".log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Stop stops every server still running.
func (c *NATS) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.servers {
		if s.proc != nil && s.proc.exited() == nil {
			s.proc.stop(10 * time.Second)
		}
	}
}
