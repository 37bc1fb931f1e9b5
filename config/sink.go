package config

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"net/url"

	"cel.dev/cel-go/cel"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/dynwatch/dynwatch/egress"
)

// Sink is what every kind of sink shares: its name, which events it selects, and how they are
// queued, retried and dead-lettered. Webhook, JetStream and Kafka embed it.
type Sink struct {
	// Name names the sink in metrics, logs, dead letters and the state store; unique across
	// every kind.
	Name string `mapstructure:"name"`
	// Resources selects events by resource[.group] ("configmaps", "deployments.apps"); empty
	// selects every watched resource.
	Resources  []string `mapstructure:"resources"`
	EventTypes []string `mapstructure:"eventTypes"` // ADDED, MODIFIED, DELETED; empty: all
	Namespaces []string `mapstructure:"namespaces"` // empty: all (and cluster-scoped objects)
	// LabelSelector selects events whose object (or, for MODIFIED, old object) matches.
	LabelSelector string `mapstructure:"labelSelector"`
	// Filter is a CEL expression over type, object, oldObject and resource; true delivers.
	Filter string `mapstructure:"filter"`
	// FilterErrors is what becomes of an event the filter cannot decide on (an evaluation
	// error, its cost limit): FilterErrorsDeadLetter, FilterErrorsDeliver or FilterErrorsDrop.
	FilterErrors FilterErrors  `mapstructure:"filterErrors"`
	Timeout      time.Duration `mapstructure:"timeout"`
	Workers      int           `mapstructure:"workers"`
	QueueSize    int           `mapstructure:"queueSize"`
	Retry        Retry         `mapstructure:"retry"`
	DeadLetter   DeadLetter    `mapstructure:"deadLetter"`
	// Payload shapes the body: a diff with MODIFIED events, or the diff alone.
	Payload Payload `mapstructure:"payload"`
	// InitialState hands a sink, when it is first configured (at start, or added by a
	// reload), every current object its filters select as ADDED, before each object's later
	// changes. It applies once, to a sink dynwatch has not seen before: setting it on a sink
	// already configured replays nothing, and it is not part of Source.
	InitialState bool `mapstructure:"initialState"`

	// Source is the entry as written in the file, canonically encoded, without initialState.
	Source string `mapstructure:"-"`
	// Subject, when set, is the user each delivery is authorized as (a Subscription's).
	Subject *Subject `mapstructure:"-"`
	// Limiter, when set, is waited on before each attempt; the sinks of one namespace's
	// Subscriptions share one.
	Limiter *rate.Limiter `mapstructure:"-"`
	// Egress, when set, bounds the addresses every connection of the sink may dial (a
	// Subscription's): a webhook's, its NATS servers' (those they announce too) or its Kafka
	// brokers' (those the cluster's metadata names too). A webhook then uses no proxy: the
	// guard would see the proxy's address.
	Egress *egress.Policy `mapstructure:"-"`
	// Parsed by Load.
	GroupResources []schema.GroupResource `mapstructure:"-"`
	Labels         labels.Selector        `mapstructure:"-"`
	Program        cel.Program            `mapstructure:"-"` // nil without a filter
	DeadLetterURL  *url.URL               `mapstructure:"-"`
}

// SinkConfig is one configured sink of any kind: a *Webhook, a *JetStream or a *Kafka.
type SinkConfig interface {
	// Shared returns the settings every kind has.
	Shared() *Sink
	// Same reports whether o configures the same sink: the same kind, the same entry in the
	// file and the same contents of the files it reads.
	Same(o SinkConfig) bool
	// SecretFiles lists the files the sink reads its credentials from.
	SecretFiles() []string

	// key is the configuration key of the list the sink is an entry of.
	key() string
	setDefaults()
	// validate checks and parses the entry at path, adding what is wrong to p.
	validate(path string, resources []Resource, env *cel.Env, p *problems)
}

// Retry bounds redelivery: exponential backoff with jitter from InitialBackoff up to
// MaxBackoff between attempts, giving up MaxElapsed after the first.
type Retry struct {
	InitialBackoff time.Duration `mapstructure:"initialBackoff"`
	MaxBackoff     time.Duration `mapstructure:"maxBackoff"`
	MaxElapsed     time.Duration `mapstructure:"maxElapsed"`
}

// DeadLetter says where events go that cannot be delivered: appended as JSON lines to File,
// POSTed to URL, or both. With neither, they are logged. A dead letter names the event (id,
// type, object reference, reason, error); the object itself only with IncludeObject, since it
// may hold what a dead-letter reader must not see.
type DeadLetter struct {
	File          string `mapstructure:"file"`
	URL           string `mapstructure:"url"`
	IncludeObject bool   `mapstructure:"includeObject"`
}

// Secret holds a credential. It prints as [redacted] so it never reaches a log or an error.
type Secret []byte

// String implements fmt.Stringer.
func (Secret) String() string { return "[redacted]" }

// GoString implements fmt.GoStringer.
func (Secret) GoString() string { return "[redacted]" }

// MarshalText implements encoding.TextMarshaler, for JSON and slog.
func (Secret) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }

// The webhook defaults: a zero value in the file means the default.
const (
	DefaultWebhookTimeout = 10 * time.Second
	DefaultWebhookWorkers = 4
	DefaultQueueSize      = 10000
	// DefaultQueueSizeWithState is the queue's default with a state store (state.path), where
	// the queue is a window over the sink's outbox on disk: what does not fit waits there and
	// is read back, in order, as the queue drains. Through an initial list each queued event
	// holds about 400 bytes (its entry, its key's place in the queue); a window of 1,000
	// keeps four workers fed and leaves the rest of a list on disk: at 10,000 configmaps with
	// two webhooks, the queues' 7.1 MB left the heap at its peak, and the peak through the
	// initial deliveries went from 96–106 MB to 89–103 MB (docs/benchmarks-history.md, "The
	// initial deliveries' queue as a window").
	DefaultQueueSizeWithState = 1000
	DefaultInitialBackoff     = 500 * time.Millisecond
	DefaultMaxBackoff         = 30 * time.Second
	DefaultMaxElapsed         = 10 * time.Minute
)

// FilterErrors is a sink's policy for events its filter cannot decide on.
type FilterErrors string

const (
	// FilterErrorsDeadLetter is the default: the event goes to the sink's dead letters with
	// reason filterError: a filter may be access control, so failing open could leak, and
	// failing closed silently would lose the event.
	FilterErrorsDeadLetter FilterErrors = "deadLetter"
	// FilterErrorsDeliver sends the event, flagged with the CloudEvents extension attribute
	// filtererror.
	FilterErrorsDeliver FilterErrors = "deliver"
	// FilterErrorsDrop leaves the event out, as if the filter had returned false (it is still
	// counted and logged).
	FilterErrorsDrop FilterErrors = "drop"
)

// Payload shapes a sink's request bodies.
type Payload struct {
	// Diff adds to MODIFIED events the change from oldObject to object, as a patch: none
	// (the default), DiffJSONPatch or DiffMergePatch.
	Diff Diff `mapstructure:"diff"`
	// Object is PayloadFull (the default): MODIFIED events carry object and oldObject; or
	// PayloadNone: they carry the diff alone. ADDED and DELETED events always carry object.
	Object PayloadObject `mapstructure:"object"`
}

// Diff is the form of the change a MODIFIED event carries.
type Diff string

const (
	// DiffNone adds no patch.
	DiffNone Diff = "none"
	// DiffJSONPatch adds an RFC 6902 JSON Patch (application/json-patch+json).
	DiffJSONPatch Diff = "jsonPatch"
	// DiffMergePatch adds an RFC 7386 JSON merge patch (application/merge-patch+json).
	DiffMergePatch Diff = "mergePatch"
)

// PayloadObject says whether MODIFIED events carry object and oldObject beside their diff.
type PayloadObject string

// The values of PayloadObject.
const (
	PayloadFull PayloadObject = "full" // object and oldObject
	PayloadNone PayloadObject = "none" // the diff alone
)

// celEnv declares the variables a sink's filter sees.
func celEnv() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable("type", cel.StringType),
		cel.Variable("object", cel.DynType),
		cel.Variable("oldObject", cel.DynType),
		cel.Variable("resource", cel.MapType(cel.StringType, cel.StringType)),
	)
}

// validate checks and parses the settings every kind shares.
func (w *Sink) validate(path string, resources []Resource, env *cel.Env, p *problems) {
	for j, name := range w.Resources {
		gr := schema.ParseGroupResource(name)
		watched := slices.ContainsFunc(resources, func(r Resource) bool {
			return r.Group == gr.Group && (r.Resource == gr.Resource || r.Kind != "" || r.IsWildcard())
		})
		if !watched {
			p.add(fmt.Sprintf("%s.resources[%d]", path, j), "%q is not a watched resource (write resource.group, e.g. deployments.apps)", name)
		}
		w.GroupResources = append(w.GroupResources, gr)
	}
	for j, t := range w.EventTypes {
		if t != "ADDED" && t != "MODIFIED" && t != "DELETED" {
			p.add(fmt.Sprintf("%s.eventTypes[%d]", path, j), "must be ADDED, MODIFIED or DELETED, got %q", t)
		}
	}
	for j, ns := range w.Namespaces {
		for _, msg := range validation.IsDNS1123Label(ns) {
			p.add(fmt.Sprintf("%s.namespaces[%d]", path, j), "%s", msg)
		}
	}
	var err error
	if w.Labels, err = labels.Parse(w.LabelSelector); err != nil {
		p.add(path+".labelSelector", "%v", err)
	}
	if w.Filter != "" {
		w.Program = compileFilter(path+".filter", w.Filter, env, p)
	}
	if !slices.Contains([]FilterErrors{FilterErrorsDeadLetter, FilterErrorsDeliver, FilterErrorsDrop}, w.FilterErrors) {
		p.add(path+".filterErrors", "must be %s, %s or %s, got %q", FilterErrorsDeadLetter, FilterErrorsDeliver, FilterErrorsDrop, w.FilterErrors)
	}
	w.Payload.validate(path+".payload", p)
	w.checkLimits(path, p)
	if w.DeadLetter.File != "" {
		if dir := filepath.Dir(w.DeadLetter.File); !isDir(dir) {
			p.add(path+".deadLetter.file", "directory %s does not exist", dir)
		}
	}
	if w.DeadLetter.URL != "" {
		w.DeadLetterURL = checkURL(path+".deadLetter.url", w.DeadLetter.URL, false, p)
	}
}

func (pl Payload) validate(path string, p *problems) {
	if !slices.Contains([]Diff{DiffNone, DiffJSONPatch, DiffMergePatch}, pl.Diff) {
		p.add(path+".diff", "must be %s, %s or %s, got %q", DiffNone, DiffJSONPatch, DiffMergePatch, pl.Diff)
	}
	switch {
	case !slices.Contains([]PayloadObject{PayloadFull, PayloadNone}, pl.Object):
		p.add(path+".object", "must be %s or %s, got %q", PayloadFull, PayloadNone, pl.Object)
	case pl.Object == PayloadNone && pl.Diff == DiffNone:
		p.add(path+".object", "is none, so MODIFIED events would carry nothing of the change; set payload.diff to %s or %s", DiffJSONPatch, DiffMergePatch)
	}
}

func (w *Sink) checkLimits(path string, p *problems) {
	if w.Timeout < 0 {
		p.add(path+".timeout", "must be positive, got %s", w.Timeout)
	}
	if w.Workers < 1 || w.Workers > 256 {
		p.add(path+".workers", "must be between 1 and 256, got %d", w.Workers)
	}
	if w.QueueSize < 1 {
		p.add(path+".queueSize", "must be at least 1, got %d", w.QueueSize)
	}
	r := w.Retry
	switch {
	case r.InitialBackoff < 0:
		p.add(path+".retry.initialBackoff", "must be positive, got %s", r.InitialBackoff)
	case r.MaxBackoff < r.InitialBackoff:
		p.add(path+".retry.maxBackoff", "must be at least initialBackoff (%s), got %s", r.InitialBackoff, r.MaxBackoff)
	case r.MaxElapsed < r.InitialBackoff:
		p.add(path+".retry.maxElapsed", "must be at least initialBackoff (%s), got %s", r.InitialBackoff, r.MaxElapsed)
	}
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

func compileFilter(path, expr string, env *cel.Env, p *problems) cel.Program {
	if env == nil {
		return nil
	}
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		p.add(path, "%v", iss.Err())
		return nil
	}
	if ast.OutputType() != cel.BoolType && ast.OutputType() != cel.DynType {
		p.add(path, "must evaluate to a bool, not %s", ast.OutputType())
		return nil
	}
	prg, err := env.Program(ast, cel.EvalOptions(cel.OptOptimize), cel.CostLimit(1_000_000), cel.CostTracking(equalityCosts{}))
	if err != nil {
		p.add(path, "%v", err)
		return nil
	}
	return prg
}
