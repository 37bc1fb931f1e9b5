package delivery

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

// The reasons a delivery is dead-lettered.
const (
	reasonRetriesExhausted = "retries_exhausted"
	reasonRejected         = "rejected"
	reasonQueueFull        = "queue_full"
	reasonShutdown         = "shutdown"
	reasonRemoved          = "sink_removed"
	reasonFilterError      = "filterError"
	reasonGone             = "gone"
)

var reasons = []string{reasonRetriesExhausted, reasonRejected, reasonQueueFull, reasonShutdown, reasonRemoved, reasonFilterError, reasonGone}

// DeadLetter is one undeliverable event as written to a dead-letter file (one JSON object per
// line), POSTed to a dead-letter URL, or logged. It names the event; it carries the request
// body only when the sink's deadLetter.includeObject is set.
type DeadLetter struct {
	Time time.Time `json:"time"`
	// Cluster is the id of the cluster the event came from.
	Cluster  string          `json:"cluster,omitempty"`
	Sink     string          `json:"sink"`
	Reason   string          `json:"reason"`
	Attempts int             `json:"attempts"`
	Error    string          `json:"error,omitempty"`
	ID       string          `json:"id"`
	Type     string          `json:"type"`
	Object   ObjectRef       `json:"object"`
	Event    json.RawMessage `json:"event,omitempty"`

	seq uint64 // the delivery's outbox entry, removed once the dead letter is written
}

// ObjectRef names an event's object.
type ObjectRef struct {
	Resource        string `json:"resource"` // resource.version.group
	Namespace       string `json:"namespace,omitempty"`
	Name            string `json:"name"`
	UID             string `json:"uid"`
	ResourceVersion string `json:"resourceVersion"`
}

func refOf(d journal.Entry) ObjectRef {
	o := d.Event.Object
	return ObjectRef{Resource: object.ResourceName(d.Event.Resource), Namespace: o.GetNamespace(), Name: o.GetName(), UID: string(o.GetUID()), ResourceVersion: o.GetResourceVersion()}
}

// target is where a sink's dead letters go; a reload may change it.
type target struct {
	file          string
	url           *url.URL
	includeObject bool
	client        *http.Client
	timeout       time.Duration
}

// deadLetters writes a sink's dead letters from its own goroutine. Submitting one never
// blocks and never drops it: the backlog is bounded only by what the queue held.
type deadLetters struct {
	sink    string
	cluster string
	log     *slog.Logger
	m       sinkMetrics
	j       *journal.Journal
	target  atomic.Pointer[target]

	mu      sync.Mutex
	backlog []DeadLetter
	closed  bool
	wake    chan struct{}
	done    chan struct{}
	abandon context.Context // ended when the shutdown deadline passes
	cancel  context.CancelFunc
	started sync.Once
}

func newDeadLetters(sink, cluster string, log *slog.Logger, m sinkMetrics, j *journal.Journal, cfg config.SinkConfig) *deadLetters {
	dl := &deadLetters{sink: sink, cluster: cluster, log: log, m: m, j: j, wake: make(chan struct{}, 1), done: make(chan struct{})}
	dl.abandon, dl.cancel = context.WithCancel(context.Background())
	dl.setTarget(cfg)
	return dl
}

// setTarget makes cfg's deadLetter settings current. A webhook's dead letters are POSTed with
// its TLS settings; other kinds' with Go's defaults, since their TLS settings are for their
// brokers.
func (dl *deadLetters) setTarget(cfg config.SinkConfig) {
	var tlsConfig *tls.Config
	if w, ok := cfg.(*config.Webhook); ok {
		tlsConfig = w.TLSConfig
	}
	c := cfg.Shared()
	dl.target.Store(&target{file: c.DeadLetter.File, url: c.DeadLetterURL, includeObject: c.DeadLetter.IncludeObject,
		client: newClient(tlsConfig, 1, c.Timeout, Always{}), timeout: c.Timeout})
}

// submit dead-letters d with reason. It never blocks.
func (dl *deadLetters) submit(d Delivery, reason string, err error) {
	dl.m.deadLetters[reason].Inc()
	dl.m.deadLettered.Inc()
	rec := DeadLetter{Time: time.Now().UTC(), Cluster: dl.cluster, Sink: dl.sink, Reason: reason, Attempts: d.Attempts, ID: d.ID, Type: string(d.Event.Type), Object: refOf(d.Entry), seq: d.Seq}
	if err != nil {
		rec.Error = err.Error()
	}
	if dl.target.Load().includeObject {
		rec.Event = journal.AppendBody(nil, d.Entry)
	}
	dl.mu.Lock()
	closed := dl.closed
	if !closed {
		dl.backlog = append(dl.backlog, rec)
	}
	dl.mu.Unlock()
	if closed {
		dl.logRecord(rec, "its writer had stopped")
		return
	}
	select {
	case dl.wake <- struct{}{}:
	default:
	}
}

// start runs the writer; starting it again does nothing.
func (dl *deadLetters) start() { dl.started.Do(func() { go dl.run() }) }

// close waits for the dead letters submitted so far to be written, until ctx ends; those
// still unwritten then are abandoned: with a state store they stay in the outbox for the next
// start, without one they are logged.
func (dl *deadLetters) close(ctx context.Context) {
	dl.start()
	dl.mu.Lock()
	dl.closed = true
	dl.mu.Unlock()
	select {
	case dl.wake <- struct{}{}:
	default:
	}
	select {
	case <-dl.done:
	case <-ctx.Done():
		dl.cancel()
		<-dl.done
	}
}

// run writes dead letters until close. A written dead letter leaves the outbox.
func (dl *deadLetters) run() {
	defer close(dl.done)
	for {
		dl.mu.Lock()
		batch, closed := dl.backlog, dl.closed
		dl.backlog = nil
		dl.mu.Unlock()
		for i, rec := range batch {
			if dl.abandon.Err() != nil {
				dl.abandoned(batch[i:])
				return
			}
			dl.write(rec)
		}
		if closed && len(batch) == 0 {
			return
		}
		if len(batch) == 0 {
			select {
			case <-dl.wake:
			case <-dl.abandon.Done():
			}
		}
	}
}

func (dl *deadLetters) abandoned(recs []DeadLetter) {
	kept := 0
	for _, rec := range recs {
		if rec.seq != 0 {
			kept++
			continue
		}
		dl.m.deadLetterFailures.Inc()
		dl.logRecord(rec, "not written before the shutdown deadline")
	}
	if kept > 0 {
		dl.log.Warn("dead letters not written before the shutdown deadline stay in the outbox for the next start", "events", kept)
	}
}

func (dl *deadLetters) write(rec DeadLetter) {
	t := dl.target.Load()
	line, _ := json.Marshal(rec)
	written := false
	if t.file != "" {
		if err := appendLine(t.file, line); err != nil {
			dl.log.Error("write dead letter", "file", t.file, "id", rec.ID, "err", err)
		} else {
			written = true
		}
	}
	if t.url != nil {
		if err := dl.post(t, line); err != nil {
			dl.log.Error("post dead letter", "url", config.Redacted(t.url), "id", rec.ID, "err", err)
		} else {
			written = true
		}
	}
	if !written && rec.seq != 0 && dl.abandon.Err() != nil {
		dl.abandoned([]DeadLetter{rec}) // cut short by the shutdown deadline: it stays in the outbox
		return
	}
	if !written {
		if t.file != "" || t.url != nil {
			dl.m.deadLetterFailures.Inc()
		}
		dl.logRecord(rec, "")
	}
	dl.j.Ack(dl.sink, rec.seq)
}

// logRecord logs a dead letter without the object; written, when set, says why it was not
// written to the dead-letter target.
func (dl *deadLetters) logRecord(rec DeadLetter, written string) {
	log := dl.log
	if written != "" {
		log = log.With("unwritten", written)
	}
	log.Error("dead letter", "id", rec.ID, "type", rec.Type, "resource", rec.Object.Resource, "namespace", rec.Object.Namespace, "name", rec.Object.Name,
		"reason", rec.Reason, "attempts", rec.Attempts, "error", rec.Error)
}

func appendLine(path string, line []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(line, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (dl *deadLetters) post(t *target, line []byte) error {
	ctx, cancel := context.WithTimeout(dl.abandon, t.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url.String(), bytes.NewReader(line))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message repeats the URL, credentials included
		}
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return nil
}
