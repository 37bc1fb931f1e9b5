package jetstream

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
)

// CheckDurability implements delivery.DurabilityChecker: it reads the stream's configuration
// (its storage, persist mode and replicas, and the servers that hold it) and, from each
// monitoring endpoint in durability.monitorURLs, whether that server syncs every write to disk
// before it acknowledges (jetstream.sync_interval: always). No client request tells the latter:
// without a monitoring endpoint for each of the stream's servers it is Unknown.
func (t *Transport) CheckDurability(ctx context.Context) delivery.Durability {
	want := t.cfg.Durability
	js, err := t.connect()
	if err != nil {
		return delivery.Durabilityf(delivery.DurableUnknown, "Unreachable", "%s", err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	s, err := t.streamFor(ctx, js, t.cfg.SubjectPrefix+".>")
	if err != nil {
		return delivery.Durabilityf(delivery.DurableUnknown, "Unreachable", "%s", err.Error())
	}
	info, err := s.Info(ctx)
	if err != nil {
		return delivery.Durabilityf(delivery.DurableUnknown, "Unreachable", "stream %s: %v", s.CachedInfo().Config.Name, err)
	}
	c := info.Config
	switch {
	case c.Storage != jetstream.FileStorage:
		return delivery.Durabilityf(delivery.DurableFalse, "MemoryStorage", "stream %s keeps its messages in memory (storage: memory)", c.Name)
	case c.Replicas < want.MinReplicas:
		return delivery.Durabilityf(delivery.DurableFalse, "TooFewReplicas", "stream %s has %d replicas; durability.minReplicas is %d", c.Name, c.Replicas, want.MinReplicas)
	case !*want.Sync:
		return delivery.Durabilityf(delivery.DurableTrue, "Durable", "stream %s: file storage, %d replicas (durability.sync is false: not checked to be on disk)", c.Name, c.Replicas)
	case c.PersistMode == jetstream.AsyncPersistMode:
		return delivery.Durabilityf(delivery.DurableFalse, "NotSynced", "stream %s flushes its writes asynchronously (persist_mode: async)", c.Name)
	}
	servers := streamServers(info, t.connectedServer())
	if len(want.MonitorURLs) == 0 {
		return delivery.Durabilityf(delivery.DurableUnknown, "SyncUnknown", "stream %s is on %s; set durability.monitorURLs to read whether each syncs every write", c.Name, strings.Join(servers, ", "))
	}
	syncs, err := t.readSync(ctx, want.MonitorURLs)
	if err != nil {
		return delivery.Durabilityf(delivery.DurableUnknown, "SyncUnknown", "%s", err.Error())
	}
	for _, name := range servers {
		every, known := syncs[name]
		switch {
		case !known:
			return delivery.Durabilityf(delivery.DurableUnknown, "SyncUnknown", "stream %s is on server %s, which no durability.monitorURLs endpoint reports", c.Name, name)
		case every != "always":
			return delivery.Durabilityf(delivery.DurableFalse, "NotSynced", "stream %s is on server %s, which syncs its writes to disk every %s, not each one (jetstream.sync_interval: always)", c.Name, name, every)
		}
	}
	return delivery.Durabilityf(delivery.DurableTrue, "Durable", "stream %s: file storage, %d replicas, each server (%s) syncing every write", c.Name, c.Replicas, strings.Join(servers, ", "))
}

// connectedServer is the name of the server the connection is on, "" for none.
func (t *Transport) connectedServer() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nc == nil {
		return ""
	}
	return t.nc.ConnectedServerName()
}

// streamServers are the names of the servers that hold the stream: its leader and replicas,
// or, for a server not in a cluster, connected.
func streamServers(info *jetstream.StreamInfo, connected string) []string {
	var out []string
	if cl := info.Cluster; cl != nil {
		if cl.Leader != "" {
			out = append(out, cl.Leader)
		}
		for _, p := range cl.Replicas {
			out = append(out, p.Name)
		}
	}
	if len(out) == 0 && connected != "" {
		out = append(out, connected)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// varz is what CheckDurability reads of a server's /varz.
type varz struct {
	ServerName string `json:"server_name"`
	JetStream  struct {
		Config struct {
			SyncInterval time.Duration `json:"sync_interval"`
			SyncAlways   bool          `json:"sync_always"`
		} `json:"config"`
	} `json:"jetstream"`
}

// readSync reads each monitoring endpoint's /varz and returns, by server name, how often the
// server syncs its writes to disk: "always", or an interval.
func (t *Transport) readSync(ctx context.Context, urls []string) (map[string]string, error) {
	client := &http.Client{Timeout: t.cfg.Timeout}
	if t.cfg.TLSConfig != nil {
		client.Transport = &http.Transport{TLSClientConfig: t.cfg.TLSConfig.Clone()}
	}
	out := map[string]string{}
	for _, u := range urls {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(u, "/")+"/varz", nil)
		if err != nil {
			return nil, fmt.Errorf("durability.monitorURLs %s: %w", config.RedactURL(u), err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("read %s/varz: %w", config.RedactURL(u), err)
		}
		var v varz
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %s", resp.Status)
		} else {
			err = json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 1<<20)).Decode(&v)
		}
		_ = resp.Body.Close() // read whole, or failed: either way done with
		if err != nil {
			return nil, fmt.Errorf("read %s/varz: %w", config.RedactURL(u), err)
		}
		switch {
		case v.JetStream.Config.SyncAlways:
			out[v.ServerName] = "always"
		case v.JetStream.Config.SyncInterval > 0:
			out[v.ServerName] = v.JetStream.Config.SyncInterval.String()
		default:
			out[v.ServerName] = "(JetStream off)"
		}
	}
	return out, nil
}
