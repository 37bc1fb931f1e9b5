package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/object"
)

// EnvPrefix prefixes the environment variables that override scalar settings, with dots in the
// key replaced by underscores: DYNWATCH_API_ADDRESS overrides api.address.
const EnvPrefix = "DYNWATCH"

// Config is the whole configuration of one dynwatch process.
type Config struct {
	// Cluster names the cluster the events come from.
	Cluster   Cluster    `mapstructure:"cluster"`
	Resources []Resource `mapstructure:"resources"`
	Webhooks  []Webhook  `mapstructure:"webhooks"`
	// JetStream are the NATS JetStream sinks, beside the webhooks.
	JetStream []JetStream `mapstructure:"jetstream"`
	// Kafka are the Kafka sinks.
	Kafka     []Kafka   `mapstructure:"kafka"`
	API       API       `mapstructure:"api"`
	Metrics   Metrics   `mapstructure:"metrics"`
	Discovery Discovery `mapstructure:"discovery"`
	Client    Client    `mapstructure:"client"`
	Log       Log       `mapstructure:"log"`
	State     State     `mapstructure:"state"`
	// ConsistencyCheck compares every resource's cache with the apiserver, now and then.
	ConsistencyCheck ConsistencyCheck `mapstructure:"consistencyCheck"`
	// LeaderElection lets several replicas run, one of which delivers.
	LeaderElection LeaderElection `mapstructure:"leaderElection"`
	// Subscriptions are the sinks teams declare as Subscription objects.
	Subscriptions Subscriptions `mapstructure:"subscriptions"`
	// ShutdownTimeout bounds a graceful stop, from SIGTERM to exit: requests under way have
	// half of it to finish, then are cut; dead letters not yet written at its end are abandoned
	// (with a state store both stay in the outbox for the next start). Keep it below the pod's
	// termination grace period.
	ShutdownTimeout time.Duration `mapstructure:"shutdownTimeout"`
}

// DefaultShutdownTimeout is below Kubernetes' default termination grace period of 30s.
const DefaultShutdownTimeout = 25 * time.Second

// DefaultStaleAfter is how long a resource's list and watch may fail before it is Stale.
const DefaultStaleAfter = time.Minute

// State configures the on-disk state store: the last state of every object handed to the
// webhooks and each webhook's outbox of undelivered events. With it, a restart neither loses
// queued events nor replays unchanged objects.
type State struct {
	// Path is the store's directory, created if need be; a file there is the store of an
	// earlier release, converted at start. Empty keeps state in memory only: events still
	// queued at shutdown are dead-lettered and a restart delivers every object as ADDED again.
	Path string `mapstructure:"path"`
	// MaxPendingBytes bounds the bytes of events recorded and not yet committed (each
	// object's JSON, its old object's, and 512 bytes): past it, while the disk is full or
	// fdatasync stalls, the informers stop reading their watches until half of it is
	// committed. It applies without a path too, where commits are only in memory.
	MaxPendingBytes int64 `mapstructure:"maxPendingBytes"`
}

// DefaultMaxPendingBytes is state.maxPendingBytes unless set.
const DefaultMaxPendingBytes = 16 << 20

// LeaderElection configures high availability: every replica runs the informers, the journal
// and the query API; the one holding a coordination.k8s.io Lease delivers, and publishes
// checkpoints that the others trim their outboxes to. It needs a state store.
type LeaderElection struct {
	Enabled bool `mapstructure:"enabled"`
	// Namespace holds the Lease and the checkpoint ConfigMap; required when enabled.
	Namespace string `mapstructure:"namespace"`
	// LeaseName is the Lease's name.
	LeaseName string `mapstructure:"leaseName"`
	// CheckpointName is the ConfigMap the leader writes its checkpoints to.
	CheckpointName string `mapstructure:"checkpointName"`
	// Identity names this replica in the Lease; empty: the host name and a random suffix.
	Identity string `mapstructure:"identity"`
	// LeaseDuration is how long the others wait, after they last saw the Lease renewed, before
	// taking it over; RenewDeadline how long the leader delivers after its last renewal
	// began (it gives up leading then), and RetryPeriod how often every replica tries to
	// acquire or renew. LeaseDuration - RenewDeadline is the fencing margin.
	LeaseDuration time.Duration `mapstructure:"leaseDuration"`
	RenewDeadline time.Duration `mapstructure:"renewDeadline"`
	RetryPeriod   time.Duration `mapstructure:"retryPeriod"`
	// CheckpointInterval is how often the leader writes checkpoints, if they moved, and the
	// others read them.
	CheckpointInterval time.Duration `mapstructure:"checkpointInterval"`
}

// Metrics configures the operations server: /metrics, /healthz, /readyz.
type Metrics struct {
	Address string `mapstructure:"address"`
	// PProf serves Go's profiles under /debug/pprof/ on the same server.
	PProf bool `mapstructure:"pprof"`
}

// Discovery controls how configured resources are matched to what the apiserver serves.
type Discovery struct {
	// Interval is how often discovery runs again, so a resource whose CRD appears or goes away
	// is picked up or stopped within about this long. A watch that fails with NotFound triggers
	// discovery at once.
	Interval time.Duration `mapstructure:"interval"`
}

// Client configures how dynwatch reads the apiserver.
type Client struct {
	// CBOR asks the apiserver for CBOR before JSON in lists and watches. An apiserver that
	// serves it (Kubernetes 1.32 and later with the CBORServingAndStorage feature gate) answers
	// in CBOR, which decodes in a fraction of JSON's time; any other answers in JSON, as
	// before. It sets client-go's ClientsAllowCBOR feature gate for the whole process.
	CBOR bool `mapstructure:"cbor"`
	// HTTP2 sends the informers' lists and watches over HTTP/2, multiplexed on one connection,
	// as client-go does by default. Without it they go over HTTP/1.1, a connection each: a
	// watch's events are read by the goroutine that decodes them, with no HTTP/2 frames, no
	// flow-control window to send back for every few KB read and no hand-over from the
	// connection's reading goroutine. Dynwatch's other requests to the apiserver keep HTTP/2.
	HTTP2 bool `mapstructure:"http2"`
	// RateLimits are the client-side rate limits of dynwatch's requests to the apiserver, one
	// client per concern, so that no concern's requests wait behind another's.
	RateLimits RateLimits `mapstructure:"rateLimits"`
}

// RateLimits are the client-side rate limits of each of dynwatch's clients.
type RateLimits struct {
	// Informers list and watch the watched resources (and discover them).
	Informers RateLimit `mapstructure:"informers"`
	// LeaderElection renews the Lease and reads and writes the checkpoints.
	LeaderElection RateLimit `mapstructure:"leaderElection"`
	// Reviews are the query API's TokenReviews. Credentials never authenticated before may
	// use half of it, so that known callers are re-reviewed promptly whatever else arrives.
	Reviews RateLimit `mapstructure:"reviews"`
	// AccessReviews are the query API's SubjectAccessReviews, shared fairly between users.
	AccessReviews RateLimit `mapstructure:"accessReviews"`
	// Reads are what the query API reads from the apiserver itself: OpenAPI documents,
	// CustomResourceDefinitions and events.
	Reads RateLimit `mapstructure:"reads"`
}

// RateLimit is a token bucket: QPS requests a second on average, Burst at once.
type RateLimit struct {
	QPS   float32 `mapstructure:"qps"`
	Burst int     `mapstructure:"burst"`
}

// Log configures the process's structured log.
type Log struct {
	Level  string `mapstructure:"level"`  // debug, info, warn or error
	Format string `mapstructure:"format"` // json or text

	// SlogLevel is Level, parsed.
	SlogLevel slog.Level `mapstructure:"-"`
}

// Wildcard is the Resource (and Version) of an entry that watches a whole API group: every
// resource of the group (the preferred version of each).
const Wildcard = "*"

// Resource is one watched resource: one informer per listed namespace, or one for all. With
// Resource "*" it is a whole API group: every resource the group serves, as discovery finds
// them, each with these settings.
type Resource struct {
	Group    string `mapstructure:"group"`
	Version  string `mapstructure:"version"`
	Resource string `mapstructure:"resource"`
	Kind     string `mapstructure:"kind"`
	// ExcludeResources leaves resources (plural names) of the group out of a wildcard entry.
	ExcludeResources []string `mapstructure:"excludeResources"`
	Namespaces       []string `mapstructure:"namespaces"`
	// ExcludeNamespaces leaves out the objects of these namespaces: names, or globs of
	// path.Match (*, ?, [a-z]). One informer watches the whole cluster; the apiserver leaves
	// out the named namespaces (a field selector), dynwatch those a glob matches, as objects
	// arrive. Not with Namespaces.
	ExcludeNamespaces []string `mapstructure:"excludeNamespaces"`
	// NamespaceSelector is a label selector over Namespace objects: only the objects of the
	// namespaces it selects are watched, followed live. A namespace that starts matching brings
	// its objects in as ADDED; one that stops matching, or is deleted, takes them out as
	// DELETED. One informer watches the whole cluster, and dynwatch watches the namespaces.
	// Not with Namespaces; with ExcludeNamespaces, the exclusions apply as well.
	NamespaceSelector string        `mapstructure:"namespaceSelector"`
	LabelSelector     string        `mapstructure:"labelSelector"`
	FieldSelector     string        `mapstructure:"fieldSelector"`
	Resync            time.Duration `mapstructure:"resync"`
	// StaleAfter is how long the resource's list and watch may keep failing (forbidden, not
	// found, unreachable) before it is Stale: /readyz fails naming it and query answers carry
	// a Warning that the data is stale.
	StaleAfter time.Duration `mapstructure:"staleAfter"`
	Transform  Transform     `mapstructure:"transform"`
	Indexers   []Indexer     `mapstructure:"indexers"`
	// Cache is what the cache keeps of each object: CacheFull, the whole object, or
	// CacheMetadata, its metadata only, as the apiserver sends it to metadata informers
	// (PartialObjectMetadata).
	Cache string `mapstructure:"cache"`
	// History keeps the resource's past versions on disk, under state.path, for the query
	// API: watches from an older resourceVersion, lists at one, each object's revisions and
	// the objects deleted. Off unless Retain is set.
	History History `mapstructure:"history"`

	// Source is the entry as written in the file, canonically encoded: two entries with the
	// same Source configure the same thing.
	Source string `mapstructure:"-"`
	// ExcludedNames and ExcludedGlobs are ExcludeNamespaces, parsed: the exact names, and the
	// patterns.
	ExcludedNames []string `mapstructure:"-"`
	ExcludedGlobs []string `mapstructure:"-"`
	// Namespaced is NamespaceSelector, parsed; nil when it is not set.
	Namespaced labels.Selector `mapstructure:"-"`
	// Labels and Fields are LabelSelector and FieldSelector, parsed; never nil after Load.
	Labels labels.Selector `mapstructure:"-"`
	Fields fields.Selector `mapstructure:"-"`
}

// History is a resource's history: what is kept and for how long.
type History struct {
	// Retain is how long the history reaches back: versions older than it are dropped,
	// whole segments at a time. 0, the default, keeps no history.
	Retain time.Duration `mapstructure:"retain"`
	// MaxBytes bounds the disk the resource's history takes: past it the oldest segments are
	// dropped though they are within Retain, and the history reaches back less far.
	MaxBytes int64 `mapstructure:"maxBytes"`
}

// Enabled reports whether the resource keeps a history.
func (h History) Enabled() bool { return h.Retain > 0 }

// DefaultHistoryMaxBytes is a resource's history.maxBytes unless set.
const DefaultHistoryMaxBytes = 1 << 30

// The values of Resource.Cache.
const (
	CacheFull     = "full"
	CacheMetadata = "metadata"
)

// MetadataOnly reports whether the resource's cache keeps its objects' metadata only.
func (r *Resource) MetadataOnly() bool { return r.Cache == CacheMetadata }

// ConsistencyCheck is the live consistency check: every Period (and up to a tenth more, at
// random), each informer's cache is compared with a list from the apiserver at
// the cache's resourceVersion, by a digest of every object's namespace, name and
// resourceVersion. A cache found to differ is listed again: the differences become events for
// every sink.
type ConsistencyCheck struct {
	Enabled bool          `mapstructure:"enabled"`
	Period  time.Duration `mapstructure:"period"`
}

// Every is how often the check runs: Period, or 0 when it is not enabled.
func (c ConsistencyCheck) Every() time.Duration {
	if !c.Enabled {
		return 0
	}
	return c.Period
}

// DefaultConsistencyCheckPeriod is consistencyCheck.period unless set: the apiserver checks its
// own watch cache against etcd as often.
const DefaultConsistencyCheckPeriod = 5 * time.Minute

// Transform lists what is removed from objects before they enter the cache.
type Transform struct {
	StripManagedFields            *bool    `mapstructure:"stripManagedFields"`
	StripLastAppliedConfiguration *bool    `mapstructure:"stripLastAppliedConfiguration"`
	RemoveFields                  []string `mapstructure:"removeFields"`
	// KeepSecretData opts a v1/secrets resource out of the default removal of data and
	// stringData. It has no effect on other resources.
	KeepSecretData bool `mapstructure:"keepSecretData"`

	// Paths is RemoveFields, parsed.
	Paths []FieldPath `mapstructure:"-"`
}

// IndexerType says what an Indexer indexes objects by.
type IndexerType string

// The indexer types.
const (
	IndexLabel      IndexerType = "label"      // the value of label Key
	IndexAnnotation IndexerType = "annotation" // the value of annotation Key
	IndexJSONPath   IndexerType = "jsonPath"   // every value Path yields
	IndexOwner      IndexerType = "owner"      // each owner as Kind/name and as its uid
)

// Indexer is an extra named index on a resource's cache.
type Indexer struct {
	Name string      `mapstructure:"name"`
	Type IndexerType `mapstructure:"type"`
	Key  string      `mapstructure:"key"`
	Path string      `mapstructure:"path"`

	// JSONPath is Path, parsed, for type jsonPath.
	JSONPath *JSONPath `mapstructure:"-"`
}

// Excludes reports whether one of the resource's ExcludeNamespaces globs matches namespace.
// (The named ones never reach dynwatch: the apiserver leaves them out.)
func (r *Resource) Excludes(namespace string) bool {
	for _, g := range r.ExcludedGlobs {
		if ok, _ := path.Match(g, namespace); ok { // the pattern was checked at load
			return true
		}
	}
	return false
}

// Exclusions is the field selector that leaves out the objects of the excluded names:
// metadata.namespace!=name for each, and the configured field selector.
func (r *Resource) Exclusions() fields.Selector {
	sel := []fields.Selector{r.Fields}
	for _, ns := range r.ExcludedNames {
		sel = append(sel, fields.OneTermNotEqualSelector("metadata.namespace", ns))
	}
	return fields.AndSelectors(sel...)
}

// IsWildcard reports whether r watches a whole API group (resource: "*").
func (r *Resource) IsWildcard() bool { return r.Resource == Wildcard }

// Member is the configuration of one resource of a wildcard entry's group, served at version:
// r's settings, for that resource alone. It shares r's parsed fields, which are read-only.
func (r *Resource) Member(version, resource string) *Resource {
	m := *r
	m.Version, m.Resource, m.ExcludeResources = version, resource, nil
	return &m
}

// GroupVersionResource returns the resource's group, version and resource, as configured.
func (r *Resource) GroupVersionResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: r.Resource}
}

// GroupVersion returns the resource's group and version.
func (r *Resource) GroupVersion() schema.GroupVersion {
	return schema.GroupVersion{Group: r.Group, Version: r.Version}
}

// IsSecrets reports whether r names core v1 secrets, whose data is removed by default.
func (r *Resource) IsSecrets() bool {
	return r.Group == "" && (r.Resource == "secrets" || r.Kind == "Secret")
}

// String names the resource as configured, in kubectl's resource.version.group form (or
// Kind.version.group when it is configured by kind).
func (r *Resource) String() string {
	name := r.Resource
	if name == "" {
		name = r.Kind
	}
	return object.ResourceName(schema.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: name})
}

// Load reads the YAML file at path, applies DYNWATCH_ environment overrides and defaults, and
// validates the result. Unknown keys are errors. The error, if any, lists every problem found.
func Load(path string) (*Config, error) {
	if path == "" {
		return nil, errors.New("--config: a configuration file is required")
	}
	v := viper.New()
	setDefaults(v)
	v.SetConfigFile(path)
	v.SetConfigType("yaml")
	v.SetEnvPrefix(EnvPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	if err := v.ReadInConfig(); err != nil {
		return nil, fmt.Errorf("read config %s: %w", path, err)
	}
	var c Config
	err := v.UnmarshalExact(&c, viper.DecodeHook(mapstructure.ComposeDecodeHookFunc(
		durationHook,
		mapstructure.StringToSliceHookFunc(","),
	)))
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	c.setListDefaults()
	if err := c.setSources(v); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("config %s is invalid:\n%w", path, err)
	}
	return &c, nil
}

// setSources records each list entry as written, so a reload can tell which entries changed.
func (c *Config) setSources(v *viper.Viper) error {
	lists := map[string][]*string{}
	for i := range c.Resources {
		lists["resources"] = append(lists["resources"], &c.Resources[i].Source)
	}
	lists["webhooks"], lists["jetstream"], lists["kafka"] = nil, nil, nil
	for _, s := range c.Sinks() {
		key := s.key()
		lists[key] = append(lists[key], &s.Shared().Source)
	}
	for key, sources := range lists {
		raw, _ := v.Get(key).([]any)
		if len(raw) != len(sources) {
			return fmt.Errorf("%s: decoded %d entries from %d", key, len(sources), len(raw))
		}
		for i, entry := range raw {
			if m, ok := entry.(map[string]any); ok && key != "resources" {
				// Whether a sink replays matters only when it is first seen: turning it on or
				// off changes nothing of a running sink.
				m = maps.Clone(m)
				delete(m, "initialstate")
				entry = m
			}
			b, err := json.Marshal(entry)
			if err != nil {
				return fmt.Errorf("%s[%d]: %w", key, i, err)
			}
			*sources[i] = string(b)
		}
	}
	return nil
}

// Sinks lists every configured sink: the webhooks, then the JetStream sinks, then the Kafka
// sinks, each in the file's order.
func (c *Config) Sinks() []SinkConfig {
	out := make([]SinkConfig, 0, len(c.Webhooks)+len(c.JetStream)+len(c.Kafka))
	for i := range c.Webhooks {
		out = append(out, &c.Webhooks[i])
	}
	for i := range c.JetStream {
		out = append(out, &c.JetStream[i])
	}
	for i := range c.Kafka {
		out = append(out, &c.Kafka[i])
	}
	return out
}

// SecretFiles lists the files credentials are read from, whose changes a reload applies.
func (c *Config) SecretFiles() []string {
	var out []string
	for _, s := range c.Sinks() {
		out = append(out, s.SecretFiles()...)
	}
	return out
}

// Unreloadable names the settings that differ between c and next and that only a restart
// applies: everything but resources and webhooks.
func (c *Config) Unreloadable(next *Config) []string {
	var changed []string
	for name, same := range map[string]bool{
		"api":             reflect.DeepEqual(c.API, next.API),
		"metrics":         c.Metrics == next.Metrics,
		"discovery":       c.Discovery == next.Discovery,
		"client":          c.Client == next.Client,
		"log":             c.Log == next.Log,
		"state":           c.State == next.State,
		"shutdownTimeout": c.ShutdownTimeout == next.ShutdownTimeout,
		"leaderElection":  c.LeaderElection == next.LeaderElection,
		"subscriptions":   reflect.DeepEqual(c.Subscriptions, next.Subscriptions),
		"cluster":         c.Cluster.ID == next.Cluster.ID && c.Cluster.Name == next.Cluster.Name && *c.Cluster.InKeys == *next.Cluster.InKeys,
	} {
		if !same {
			changed = append(changed, name)
		}
	}
	slices.Sort(changed)
	return changed
}

// durationHook decodes durations such as "500ms" or "5m", naming the bad value on error.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if from.Kind() != reflect.String || to != reflect.TypeFor[time.Duration]() {
		return data, nil
	}
	d, err := time.ParseDuration(data.(string))
	if err != nil {
		return nil, fmt.Errorf("invalid duration %q (write it like 500ms, 30s or 5m)", data)
	}
	return d, nil
}
