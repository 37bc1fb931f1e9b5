package delivery

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

// checked is a transport whose destination's durability the test sets: it counts what it is
// sent and how often it is checked.
type checked struct {
	mu     sync.Mutex
	status Durability
	sent   []string
	checks atomic.Int32
}

func (c *checked) set(status, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status = Durability{Status: status, Reason: reason, Message: "set by the test"}
}

func (c *checked) CheckDurability(context.Context) Durability {
	c.checks.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

func (c *checked) Send(_ context.Context, d *Delivery, _ []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, d.Event.Object.GetName()+"@"+d.Event.Object.GetResourceVersion())
	return nil
}

func (c *checked) Close() {}

func (c *checked) sends() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sent)
}

// TestUnderRequireNothingIsSentUntilTheDestinationIsFoundDurable: a JetStream sink whose
// destination its checks find not durable sends nothing under durability.require, whatever
// the number of checks and retries, and reports False in Status and the metric; once a check
// finds it durable, everything held is sent, each object's versions in order. The sink without require beside it
// sends at once.
func TestUnderRequireNothingIsSentUntilTheDestinationIsFoundDurable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(`resources: [{version: v1, resource: configmaps}]
jetstream:
  - {name: held, servers: ["nats://127.0.0.1:4222"], workers: 1, retry: {initialBackoff: 10ms, maxBackoff: 20ms, maxElapsed: 1h}, durability: {require: true, checkEvery: 1s}}
  - {name: told, servers: ["nats://127.0.0.1:4222"], workers: 1, durability: {checkEvery: 1s}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	dests := map[string]*checked{"held": {}, "told": {}}
	for _, c := range dests {
		c.set(DurableFalse, "NotSynced")
	}
	reg := prometheus.NewRegistry()
	transports := func(cfg config.SinkConfig, _ *slog.Logger, _ Fence) (Transport, error) {
		return dests[cfg.Shared().Name], nil
	}
	p := StartPipeline(t, Options{Logger: slog.New(slog.DiscardHandler), Registerer: reg, Transports: transports, Sinks: cfg.Sinks()}, "")
	// Three versions of one object, and another object.
	names := []string{"a@1", "a@2", "a@3", "b@1"}
	for i := range 3 {
		e := event("a")
		u, err := e.Object.Decode()
		if err != nil {
			t.Fatal(err)
		}
		u.SetResourceVersion(strconv.Itoa(i + 1))
		e.Object = object.New(u)
		p.Journal.OnEvent(e)
	}
	p.Journal.OnEvent(event("b"))
	wait := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30s", what)
			}
		}
	}
	wait("the sink without require sends", func() bool { return dests["told"].sends() == len(names) })
	wait("two checks of the held sink's destination", func() bool { return dests["held"].checks.Load() >= 2 })
	if n := dests["held"].sends(); n != 0 {
		t.Fatalf("the held sink sent %d events to a destination found not durable", n)
	}
	for _, s := range p.Status() {
		if s.Durable == nil || s.Durable.Status != DurableFalse || s.Durable.Reason != "NotSynced" {
			t.Errorf("sink %s's status says durable %+v, want False/NotSynced", s.Name, s.Durable)
		}
	}
	if v := value(p.m.durable.WithLabelValues("held", DurableFalse)); v != 1 {
		t.Errorf(`dynwatch_sink_durable{sink="held",status="False"} is %v, want 1`, v)
	}
	if v := value(p.m.attempts.WithLabelValues("held")); v != 0 {
		t.Errorf("the held sink counted %v attempts; a refusal is not one", v)
	}

	dests["held"].set(DurableTrue, "Durable")
	wait("the held sink sends once its destination is durable", func() bool { return dests["held"].sends() == len(names) })
	dests["held"].mu.Lock()
	got := dests["held"].sent
	dests["held"].mu.Unlock()
	var versions []string // of a, in the order sent
	for _, n := range got {
		if strings.HasPrefix(n, "a@") {
			versions = append(versions, n)
		}
	}
	if strings.Join(versions, " ") != "a@1 a@2 a@3" {
		t.Fatalf("the held sink sent %v: a's versions out of order", got)
	}
	if v := value(p.m.durable.WithLabelValues("held", DurableTrue)); v != 1 {
		t.Errorf(`dynwatch_sink_durable{sink="held",status="True"} is %v, want 1`, v)
	}
}

// value is a gauge's or a counter's value.
func value(m prometheus.Metric) float64 {
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		panic(err)
	}
	if g := out.GetGauge(); g != nil {
		return g.GetValue()
	}
	return out.GetCounter().GetValue()
}
