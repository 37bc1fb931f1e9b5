package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/dynwatch/dynwatch/config"
)

// The reasons a delivery is dead-lettered.
const (
	reasonRetriesExhausted = "retries_exhausted"
	reasonRejected         = "rejected"
	reasonQueueFull        = "queue_full"
	reasonShutdown         = "shutdown"
	reasonRemoved          = "sink_removed"
)

var reasons = []string{reasonRetriesExhausted, reasonRejected, reasonQueueFull, reasonShutdown, reasonRemoved}

// deadLetterBuffer bounds dead letters waiting to be written.
const deadLetterBuffer = 4096

// DeadLetter is one undeliverable event as written to a dead-letter file (one JSON object per
// line) or POSTed to a dead-letter URL.
type DeadLetter struct {
	Time     time.Time       `json:"time"`
	Sink     string          `json:"sink"`
	Reason   string          `json:"reason"`
	Attempts int             `json:"attempts"`
	Error    string          `json:"error,omitempty"`
	ID       string          `json:"id"`
	Event    json.RawMessage `json:"event"`

	seq uint64 // the delivery's outbox entry, removed once the dead letter is written
}

// deadLetters writes a sink's dead letters from its own goroutine, so that submitting one
// never blocks: not an informer handler, not a worker.
type deadLetters struct {
	cfg    *config.Webhook
	log    *slog.Logger
	m      sinkMetrics
	client *http.Client
	j      *journal
	ch     chan DeadLetter
	done   chan struct{}
}

func newDeadLetters(cfg *config.Webhook, log *slog.Logger, m sinkMetrics, client *http.Client, j *journal) *deadLetters {
	return &deadLetters{cfg: cfg, log: log, m: m, client: client, j: j, ch: make(chan DeadLetter, deadLetterBuffer), done: make(chan struct{})}
}

func (dl *deadLetters) submit(d Delivery, reason string, attempts int, err error) {
	dl.m.deadLetters[reason].Inc()
	dl.m.deadLettered.Inc()
	body := d.Body
	if body == nil {
		body = Payload(d.Event)
	}
	rec := DeadLetter{Time: time.Now().UTC(), Sink: dl.cfg.Name, Reason: reason, Attempts: attempts, ID: d.ID, Event: body, seq: d.Seq}
	if err != nil {
		rec.Error = err.Error()
	}
	select {
	case dl.ch <- rec:
	default:
		dl.m.deadLetterFailures.Inc()
		dl.log.Error("dead-letter backlog full: dead letter not written (with a state store it stays in the outbox)", "id", rec.ID, "reason", reason)
	}
}

func (dl *deadLetters) start() { go dl.run() }

// close waits for the dead letters submitted so far to be written.
func (dl *deadLetters) close() {
	close(dl.ch)
	<-dl.done
}

// run writes dead letters until close. A written dead letter leaves the outbox.
func (dl *deadLetters) run() {
	defer close(dl.done)
	var file *os.File
	if dl.cfg.DeadLetter.File != "" {
		f, err := os.OpenFile(dl.cfg.DeadLetter.File, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			dl.log.Error("cannot open the dead-letter file; dead letters go to the log", "file", dl.cfg.DeadLetter.File, "err", err)
		} else {
			file = f
			defer file.Close()
		}
	}
	for rec := range dl.ch {
		line, _ := json.Marshal(rec)
		written := false
		if file != nil {
			if _, err := file.Write(append(line, '\n')); err != nil {
				dl.log.Error("write dead letter", "file", dl.cfg.DeadLetter.File, "id", rec.ID, "err", err)
			} else {
				written = true
			}
		}
		if dl.cfg.DeadLetterURL != nil {
			if err := dl.post(line); err != nil {
				dl.log.Error("post dead letter", "url", dl.cfg.DeadLetterURL.Redacted(), "id", rec.ID, "err", err)
			} else {
				written = true
			}
		}
		if !written {
			if file != nil || dl.cfg.DeadLetterURL != nil {
				dl.m.deadLetterFailures.Inc()
			}
			dl.log.Error("dead letter", "id", rec.ID, "reason", rec.Reason, "attempts", rec.Attempts, "error", rec.Error, "event", rec.Event)
		}
		dl.j.ack(dl.cfg.Name, rec.seq)
	}
}

func (dl *deadLetters) post(line []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), dl.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, dl.cfg.DeadLetterURL.String(), bytes.NewReader(line))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := dl.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return nil
}
