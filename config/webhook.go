package config

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"cel.dev/cel-go/cel"
	"golang.org/x/net/http/httpguts"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Webhook is one HTTP sink that receives the events its filters select.
type Webhook struct {
	Name string `mapstructure:"name"`
	URL  string `mapstructure:"url"`
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
	FilterErrors      FilterErrors  `mapstructure:"filterErrors"`
	Headers           []Header      `mapstructure:"headers"`
	BearerTokenFile   string        `mapstructure:"bearerTokenFile"`
	SigningSecretFile string        `mapstructure:"signingSecretFile"` // Standard Webhooks secret, whsec_...
	TLS               TLS           `mapstructure:"tls"`
	Timeout           time.Duration `mapstructure:"timeout"`
	Workers           int           `mapstructure:"workers"`
	QueueSize         int           `mapstructure:"queueSize"`
	Retry             Retry         `mapstructure:"retry"`
	DeadLetter        DeadLetter    `mapstructure:"deadLetter"`
	// Payload shapes the request body: a diff with MODIFIED events, or the diff alone.
	Payload Payload `mapstructure:"payload"`
	// AllowCredentialsOverHTTP permits a bearer token or signing secret with a plain http://
	// URL to a host other than loopback, where anyone on the path can read or replay them.
	AllowCredentialsOverHTTP bool `mapstructure:"allowCredentialsOverHTTP"`
	// InitialState hands a sink, when it is first configured (at start, or added by a
	// reload), every current object its filters select as ADDED, before each object's later
	// changes. It applies once, to a sink dynwatch has not seen before: setting it on a sink
	// already configured replays nothing, and it is not part of Source.
	InitialState bool `mapstructure:"initialState"`

	// Source is the entry as written in the file, canonically encoded, without initialState.
	Source string `mapstructure:"-"`
	// Parsed by Load.
	Endpoint       *url.URL               `mapstructure:"-"`
	GroupResources []schema.GroupResource `mapstructure:"-"`
	Labels         labels.Selector        `mapstructure:"-"`
	Program        cel.Program            `mapstructure:"-"` // nil without a filter
	BearerToken    Secret                 `mapstructure:"-"`
	SigningSecret  Secret                 `mapstructure:"-"`          // decoded key bytes
	TLSConfig      *tls.Config            `mapstructure:"-" json:"-"` // nil: Go's defaults; never marshalled (it holds funcs)
	DeadLetterURL  *url.URL               `mapstructure:"-"`
	// FilesDigest is a digest of the TLS files' contents, so that a reload sees them change.
	FilesDigest [sha256.Size]byte `mapstructure:"-"`
}

// Header is an extra HTTP header sent with every request.
type Header struct {
	Name  string `mapstructure:"name"`
	Value string `mapstructure:"value"`
}

// TLS configures the connection to an https sink.
type TLS struct {
	CAFile             string `mapstructure:"caFile"`
	CertFile           string `mapstructure:"certFile"`
	KeyFile            string `mapstructure:"keyFile"`
	InsecureSkipVerify bool   `mapstructure:"insecureSkipVerify"`
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
	DefaultInitialBackoff = 500 * time.Millisecond
	DefaultMaxBackoff     = 30 * time.Second
	DefaultMaxElapsed     = 10 * time.Minute
)

// Same reports whether w and o configure the same sink: the same entry in the file and the
// same secrets read from their files.
func (w *Webhook) Same(o *Webhook) bool {
	return w.Source == o.Source && bytes.Equal(w.BearerToken, o.BearerToken) && bytes.Equal(w.SigningSecret, o.SigningSecret) && w.FilesDigest == o.FilesDigest
}

// SecretFiles lists the files the webhook reads its credentials from.
func (w *Webhook) SecretFiles() []string {
	var out []string
	for _, f := range []string{w.BearerTokenFile, w.SigningSecretFile, w.TLS.CAFile, w.TLS.CertFile, w.TLS.KeyFile} {
		if f != "" {
			out = append(out, f)
		}
	}
	return out
}

// MinSigningSecret is Standard Webhooks' minimum secret length, in bytes.
const MinSigningSecret = 24

// ReadBearerToken reads a bearer token file: its content without surrounding white space.
func ReadBearerToken(path string) (Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	token := Secret(strings.TrimSpace(string(b)))
	if len(token) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	return token, nil
}

// ReadSigningSecret reads a Standard Webhooks secret file (whsec_ followed by base64) and
// returns the key.
func ReadSigningSecret(path string) (Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(strings.TrimSpace(string(b)), "whsec_"))
	if err != nil || len(key) == 0 {
		return nil, fmt.Errorf("%s does not hold a Standard Webhooks secret (whsec_ followed by base64)", path)
	}
	if len(key) < MinSigningSecret {
		return nil, fmt.Errorf("%s holds a %d-byte key; Standard Webhooks requires at least %d", path, len(key), MinSigningSecret)
	}
	return key, nil
}

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

func (w *Webhook) setDefaults() {
	if w.FilterErrors == "" {
		w.FilterErrors = FilterErrorsDeadLetter
	}
	if w.Payload.Diff == "" {
		w.Payload.Diff = DiffNone
	}
	if w.Payload.Object == "" {
		w.Payload.Object = PayloadFull
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&w.Timeout, DefaultWebhookTimeout)
	def(&w.Retry.InitialBackoff, DefaultInitialBackoff)
	def(&w.Retry.MaxBackoff, DefaultMaxBackoff)
	def(&w.Retry.MaxElapsed, DefaultMaxElapsed)
	if w.Workers == 0 {
		w.Workers = DefaultWebhookWorkers
	}
	if w.QueueSize == 0 {
		w.QueueSize = DefaultQueueSize
	}
}

// celEnv declares the variables a webhook filter sees.
func celEnv() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable("type", cel.StringType),
		cel.Variable("object", cel.DynType),
		cel.Variable("oldObject", cel.DynType),
		cel.Variable("resource", cel.MapType(cel.StringType, cel.StringType)),
	)
}

// reservedHeaders are set by dynwatch itself.
var reservedHeaders = []string{"content-type", "content-length", "host", "authorization", "webhook-id", "webhook-timestamp", "webhook-signature"}

func (w *Webhook) validate(path string, resources []Resource, env *cel.Env, p *problems) {
	if errs := validation.IsDNS1123Label(w.Name); len(errs) > 0 {
		p.add(path+".name", "%s", strings.Join(errs, "; "))
	}
	w.Endpoint = checkURL(path+".url", w.URL, true, p)
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
	seen := map[string]bool{}
	for j, h := range w.Headers {
		hpath := fmt.Sprintf("%s.headers[%d]", path, j)
		lower := strings.ToLower(h.Name)
		switch {
		case !httpguts.ValidHeaderFieldName(h.Name):
			p.add(hpath+".name", "%q is not a valid header name", h.Name)
		case slices.Contains(reservedHeaders, lower) || strings.HasPrefix(lower, "ce-"):
			p.add(hpath+".name", "%s is set by dynwatch", h.Name)
		case seen[lower]:
			p.add(hpath+".name", "duplicate header %s", h.Name)
		}
		seen[lower] = true
		if !httpguts.ValidHeaderFieldValue(h.Value) {
			p.add(hpath+".value", "is not a valid header value")
		}
	}
	if w.BearerTokenFile != "" {
		if w.BearerToken, err = ReadBearerToken(w.BearerTokenFile); err != nil {
			p.add(path+".bearerTokenFile", "%v", err)
		}
	}
	if w.SigningSecretFile != "" {
		if w.SigningSecret, err = ReadSigningSecret(w.SigningSecretFile); err != nil {
			p.add(path+".signingSecretFile", "%v", err)
		}
	}
	if (w.BearerTokenFile != "" || w.SigningSecretFile != "") && w.Endpoint != nil && w.Endpoint.Scheme == "http" &&
		!IsLoopback(net.JoinHostPort(w.Endpoint.Hostname(), "0")) && !w.AllowCredentialsOverHTTP {
		p.add(path+".url", "is plain http to a host other than loopback, and the webhook has a bearer token or signing secret; use https, or set allowCredentialsOverHTTP: true")
	}
	w.TLSConfig = w.TLS.parse(path+".tls", p)
	w.FilesDigest = digestFiles(w.TLS.CAFile, w.TLS.CertFile, w.TLS.KeyFile)
	if w.TLSConfig != nil && w.Endpoint != nil && w.Endpoint.Scheme != "https" {
		p.add(path+".tls", "is set, but url is not https")
	}
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

func (w *Webhook) checkLimits(path string, p *problems) {
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

func checkURL(path, raw string, required bool, p *problems) *url.URL {
	if raw == "" {
		if required {
			p.add(path, "is required")
		}
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.add(path, "must be an http or https URL, got %q", RedactURL(raw))
		return nil
	}
	return u
}

// RedactURL returns raw with its credentials hidden: the user information and the value of
// every query parameter. A URL that does not parse is replaced whole.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "[unparsable URL redacted]"
	}
	return Redacted(u)
}

// Redacted returns u as a string with its user information and query values hidden.
func Redacted(u *url.URL) string {
	c := *u
	if c.User != nil {
		c.User = url.User("redacted")
	}
	if c.RawQuery != "" {
		q := c.Query()
		for k := range q {
			q[k] = []string{"redacted"}
		}
		c.RawQuery = q.Encode()
	}
	return c.String()
}

// digestFiles digests the contents of the named files; missing ones count as empty.
func digestFiles(paths ...string) [sha256.Size]byte {
	h := sha256.New()
	for _, path := range paths {
		b, _ := os.ReadFile(path)
		fmt.Fprintf(h, "%s:%d:", path, len(b))
		h.Write(b)
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
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
	prg, err := env.Program(ast, cel.EvalOptions(cel.OptOptimize), cel.CostLimit(1_000_000))
	if err != nil {
		p.add(path, "%v", err)
		return nil
	}
	return prg
}

// parse builds the TLS client configuration, or nil when nothing is set.
func (t TLS) parse(path string, p *problems) *tls.Config {
	if t == (TLS{}) {
		return nil
	}
	c := &tls.Config{InsecureSkipVerify: t.InsecureSkipVerify, MinVersion: tls.VersionTLS12} //nolint:gosec // the user's explicit choice
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			p.add(path+".caFile", "%v", err)
		} else if c.RootCAs = x509.NewCertPool(); !c.RootCAs.AppendCertsFromPEM(pem) {
			p.add(path+".caFile", "%s holds no PEM certificate", t.CAFile)
		}
	}
	switch {
	case (t.CertFile == "") != (t.KeyFile == ""):
		p.add(path, "certFile and keyFile go together")
	case t.CertFile != "":
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			p.add(path+".certFile", "%v", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c
}
