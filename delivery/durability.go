package delivery

import (
	"context"
	"fmt"
	"time"

	"github.com/dynwatch/dynwatch/config"
)

// The values of Durability.Status, and of dynwatch_sink_durable's status label.
const (
	DurableTrue    = "True"
	DurableFalse   = "False"
	DurableUnknown = "Unknown"
)

var durableStatuses = []string{DurableTrue, DurableFalse, DurableUnknown}

// Durability is what a destination's acknowledgement guarantees, as its own configuration
// says: Status True when an acknowledged event has at least durability.minReplicas copies and
// survives the loss of power on every server at once, False when the configuration says it
// does not, Unknown when the configuration could not be read or does not tell. Reason is one
// word for the first thing that fails (Durable when none does); Message says what was read.
type Durability struct {
	Status      string    `json:"status"`
	Reason      string    `json:"reason"`
	Message     string    `json:"message"`
	LastChecked time.Time `json:"lastChecked"`
}

// Durabilityf is a Durability of status and reason, its message formatted.
func Durabilityf(status, reason, format string, args ...any) Durability {
	return Durability{Status: status, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// DurabilityChecker is a Transport whose destination may acknowledge what it has not made
// durable (a JetStream stream, a Kafka topic). CheckDurability reads the destination's
// configuration as the sink's durability settings ask, connecting first if need be; the sink
// calls it once its workers start and every durability.checkEvery after.
type DurabilityChecker interface {
	CheckDurability(ctx context.Context) Durability
}

// durabilityOf is cfg's durability settings, nil for a kind that has none.
func durabilityOf(cfg config.SinkConfig) *config.Durability {
	switch c := cfg.(type) {
	case *config.JetStream:
		return &c.Durability
	case *config.Kafka:
		return &c.Durability
	}
	return nil
}

// watchDurability checks st's destination until ctx ends: at once, then every checkEvery. Each
// result is kept in st, for /status and for refuseUndurable, and set in the metric; a change of
// status or reason is logged once.
func (s *Sink) watchDurability(ctx context.Context, st *settings, c DurabilityChecker, want *config.Durability) {
	for {
		d := c.CheckDurability(ctx)
		if ctx.Err() != nil {
			return
		}
		if d.LastChecked.IsZero() {
			d.LastChecked = s.now().UTC()
		}
		prev := st.durable.Swap(&d)
		for _, status := range durableStatuses {
			v := 0.0
			if status == d.Status {
				v = 1
			}
			s.m.durable.WithLabelValues(status).Set(v)
		}
		if prev == nil || prev.Status != d.Status || prev.Reason != d.Reason {
			attrs := []any{"status", d.Status, "reason", d.Reason, "message", d.Message, "require", want.Require}
			switch {
			case d.Status == DurableTrue:
				s.log.Info("the destination's acknowledgement is durable", attrs...)
			case want.Require:
				s.log.Warn("the destination's acknowledgement is not known to be durable: nothing is sent until it is (durability.require)", attrs...)
			default:
				s.log.Warn("the destination's acknowledgement is not known to be durable: an acknowledged event may be lost", attrs...)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(want.CheckEvery):
		}
	}
}

// errNotDurable refuses a delivery under durability.require while the destination is not known
// to be durable; it is retried as a failed attempt is.
type errNotDurable struct{ d *Durability }

func (e errNotDurable) Error() string {
	if e.d == nil {
		return "durability.require: the destination's durability has not been checked yet"
	}
	return "durability.require: the destination is not known to be durable (" + e.d.Reason + "): " + e.d.Message
}

// refuseUndurable is errNotDurable when st requires a durable destination and its last check
// did not find one, else nil.
func (st *settings) refuseUndurable() error {
	if want := durabilityOf(st.src); want == nil || !want.Require {
		return nil
	}
	if d := st.durable.Load(); d == nil || d.Status != DurableTrue {
		return errNotDurable{d}
	}
	return nil
}
