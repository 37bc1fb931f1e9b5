package config

import (
	"net"
	"os"
	"time"
)

// API configures the query API server.
type API struct {
	Address string `mapstructure:"address"`
	// MaxPageSize caps the items of one list response; the rest come through continue tokens.
	MaxPageSize int `mapstructure:"maxPageSize"`
	// WatchHistory is how many recent events per resource a watch can resume from.
	WatchHistory int `mapstructure:"watchHistory"`
	// RequestTimeout bounds answering one request other than a watch, scans included.
	RequestTimeout time.Duration `mapstructure:"requestTimeout"`
	// MaxWatchTimeout bounds one watch; clients ask for less with timeoutSeconds.
	MaxWatchTimeout time.Duration `mapstructure:"maxWatchTimeout"`
	// FieldSelectors is strict (the fields the apiserver accepts for each resource, plus the
	// paths of its jsonPath indexers) or any (every dot path of the object).
	FieldSelectors FieldSelectorMode `mapstructure:"fieldSelectors"`
	// Events is where a list of core v1 events comes from when events are not a watched
	// resource (kubectl describe lists them): apiserver (read with dynwatch's identity after
	// the caller is authorized to list them) or none (always empty).
	Events EventsSource `mapstructure:"events"`
	Auth   Auth         `mapstructure:"auth"`
	TLS    ServingTLS   `mapstructure:"tls"`
	Limits Limits       `mapstructure:"limits"`
}

// FieldSelectorMode says which fields a query's fieldSelector may name.
type FieldSelectorMode string

// The field selector modes.
const (
	FieldSelectorsStrict FieldSelectorMode = "strict"
	FieldSelectorsAny    FieldSelectorMode = "any"
)

// EventsSource says where unwatched events come from.
type EventsSource string

// The events sources.
const (
	EventsFromAPIServer EventsSource = "apiserver"
	EventsNone          EventsSource = "none"
)

// AuthMode says who may read through the query API.
type AuthMode string

// The authentication modes.
const (
	// AuthKubernetes authenticates every request with the cluster (TokenReview, client
	// certificates) and authorizes it with SubjectAccessReview, as the apiserver would.
	AuthKubernetes AuthMode = "kubernetes"
	// AuthNone serves anyone who reaches the port with dynwatch's own permissions.
	AuthNone AuthMode = "none"
)

// Auth configures authentication and authorization of query API requests.
type Auth struct {
	Mode AuthMode `mapstructure:"mode"`
	// AllowNoneOnNetwork opts into mode none on an address other than loopback.
	AllowNoneOnNetwork bool `mapstructure:"allowNoneOnNetwork"`
	// ClientCAFile, when set, authenticates TLS client certificates signed by this CA
	// (user = CN, groups = O), as the apiserver's --client-ca-file does. Reloaded on change.
	ClientCAFile string `mapstructure:"clientCAFile"`
	// TokenCacheTTL is how long a TokenReview answer is reused.
	TokenCacheTTL time.Duration `mapstructure:"tokenCacheTTL"`
	// AllowCacheTTL and DenyCacheTTL are how long a SubjectAccessReview answer is reused.
	AllowCacheTTL time.Duration `mapstructure:"allowCacheTTL"`
	DenyCacheTTL  time.Duration `mapstructure:"denyCacheTTL"`
}

// ServingTLS configures the query API's serving certificate.
type ServingTLS struct {
	// Enabled serves HTTPS. Turning it off sends bearer tokens in the clear.
	Enabled bool `mapstructure:"enabled"`
	// CertFile and KeyFile are the serving certificate (with its chain) and key, re-read when
	// they change. With neither, a self-signed certificate is generated at start.
	CertFile string `mapstructure:"certFile"`
	KeyFile  string `mapstructure:"keyFile"`
	// SelfSignedHosts are the extra DNS names and IPs of a generated certificate (loopback
	// and the host name are always in it).
	SelfSignedHosts []string `mapstructure:"selfSignedHosts"`
	// SelfSignedCAFile is where the CA of a generated certificate is written, for clients.
	SelfSignedCAFile string `mapstructure:"selfSignedCAFile"`
}

// Limits bound what callers can cost the query API.
type Limits struct {
	// MaxURLLength caps a request's path and query string, selectors included (414 beyond).
	MaxURLLength int `mapstructure:"maxURLLength"`
	// MaxInFlight and MaxInFlightPerUser cap requests other than watches being answered at
	// once, in all and per authenticated user (429 beyond).
	MaxInFlight        int `mapstructure:"maxInFlight"`
	MaxInFlightPerUser int `mapstructure:"maxInFlightPerUser"`
	// MaxWatches and MaxWatchesPerUser cap open watches, in all and per user (429 beyond).
	MaxWatches        int `mapstructure:"maxWatches"`
	MaxWatchesPerUser int `mapstructure:"maxWatchesPerUser"`
	// MaxAuthenticating caps requests whose credential, never authenticated before, is being
	// reviewed (a TokenReview) at once, before they hold any other slot. They take turns fairly
	// between client addresses and their connections; a connection has at most two waiting or
	// under review. Credentials authenticated before are reviewed outside it. 429 beyond.
	MaxAuthenticating int `mapstructure:"maxAuthenticating"`
	// MaxAuthorizing caps requests whose decision is being reviewed (a SubjectAccessReview,
	// for a decision not cached) at once. They take turns fairly between users; a user has at
	// most a quarter of it (at least 1) waiting or under review. 429 beyond.
	MaxAuthorizing int `mapstructure:"maxAuthorizing"`
}

func (a *API) validate(p *problems) {
	checkAddress("api.address", a.Address, p)
	if a.MaxPageSize < 1 {
		p.add("api.maxPageSize", "must be at least 1, got %d", a.MaxPageSize)
	}
	if a.WatchHistory < 0 {
		p.add("api.watchHistory", "must not be negative, got %d", a.WatchHistory)
	}
	if a.RequestTimeout < time.Second {
		p.add("api.requestTimeout", "must be at least 1s, got %s", a.RequestTimeout)
	}
	if a.MaxWatchTimeout < time.Second {
		p.add("api.maxWatchTimeout", "must be at least 1s, got %s", a.MaxWatchTimeout)
	}
	if a.FieldSelectors != FieldSelectorsStrict && a.FieldSelectors != FieldSelectorsAny {
		p.add("api.fieldSelectors", "must be %q or %q, got %q", FieldSelectorsStrict, FieldSelectorsAny, a.FieldSelectors)
	}
	if a.Events != EventsFromAPIServer && a.Events != EventsNone {
		p.add("api.events", "must be %q or %q, got %q", EventsFromAPIServer, EventsNone, a.Events)
	}
	switch a.Auth.Mode {
	case AuthKubernetes:
	case AuthNone:
		if !IsLoopback(a.Address) && !a.Auth.AllowNoneOnNetwork {
			p.add("api.auth.mode", "none serves every watched object to anyone who reaches %s; bind api.address to 127.0.0.1 or set api.auth.allowNoneOnNetwork: true", a.Address)
		}
		if a.Auth.ClientCAFile != "" {
			p.add("api.auth.clientCAFile", "is not used with api.auth.mode none")
		}
	default:
		p.add("api.auth.mode", "must be kubernetes or none, got %q", a.Auth.Mode)
	}
	for path, ttl := range map[string]time.Duration{"api.auth.tokenCacheTTL": a.Auth.TokenCacheTTL, "api.auth.allowCacheTTL": a.Auth.AllowCacheTTL, "api.auth.denyCacheTTL": a.Auth.DenyCacheTTL} {
		if ttl < 0 {
			p.add(path, "must not be negative, got %s", ttl)
		}
	}
	if a.Auth.ClientCAFile != "" {
		checkReadable("api.auth.clientCAFile", a.Auth.ClientCAFile, p)
		if !a.TLS.Enabled {
			p.add("api.auth.clientCAFile", "client certificates need api.tls.enabled")
		}
	}
	if (a.TLS.CertFile == "") != (a.TLS.KeyFile == "") {
		p.add("api.tls", "certFile and keyFile must be set together")
	}
	if a.TLS.CertFile != "" {
		checkReadable("api.tls.certFile", a.TLS.CertFile, p)
		checkReadable("api.tls.keyFile", a.TLS.KeyFile, p)
		if len(a.TLS.SelfSignedHosts) > 0 || a.TLS.SelfSignedCAFile != "" {
			p.add("api.tls", "selfSignedHosts and selfSignedCAFile apply only without certFile")
		}
	}
	for path, v := range map[string]int{
		"api.limits.maxURLLength": a.Limits.MaxURLLength, "api.limits.maxInFlight": a.Limits.MaxInFlight,
		"api.limits.maxInFlightPerUser": a.Limits.MaxInFlightPerUser, "api.limits.maxWatches": a.Limits.MaxWatches,
		"api.limits.maxWatchesPerUser": a.Limits.MaxWatchesPerUser, "api.limits.maxAuthenticating": a.Limits.MaxAuthenticating,
		"api.limits.maxAuthorizing": a.Limits.MaxAuthorizing,
	} {
		if v < 1 {
			p.add(path, "must be at least 1, got %d", v)
		}
	}
	if a.Limits.MaxURLLength > 0 && a.Limits.MaxURLLength < 1024 {
		p.add("api.limits.maxURLLength", "must be at least 1024, got %d", a.Limits.MaxURLLength)
	}
}

// IsLoopback reports whether the host of a host:port address is a loopback IP or localhost.
func IsLoopback(address string) bool {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func checkReadable(path, file string, p *problems) {
	if _, err := os.Stat(file); err != nil {
		p.add(path, "%v", err)
	}
}
