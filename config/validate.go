package config

import (
	"errors"
	"fmt"
	"net"
	"path"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// NamespaceIndex is the name of the index every resource's cache has; indexers may not use it.
const NamespaceIndex = "namespace"

var (
	indexerName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]*$`)
	kindName    = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
)

// problems collects validation errors, each prefixed with its path in the file.
type problems []error

func (p *problems) add(path, format string, args ...any) {
	*p = append(*p, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
}

// validate checks the whole tree, fills the parsed fields, and reports every problem at once.
func (c *Config) validate() error {
	var p problems
	c.validateResources(&p)
	c.validateSinks(&p)
	c.API.validate(&p)
	c.Client.RateLimits.validate(&p)
	c.Subscriptions.validate(&p)
	checkAddress("metrics.address", c.Metrics.Address, &p)
	if c.Discovery.Interval < time.Second {
		p.add("discovery.interval", "must be at least 1s, got %s", c.Discovery.Interval)
	}
	if err := c.Log.SlogLevel.UnmarshalText([]byte(c.Log.Level)); err != nil {
		p.add("log.level", "must be debug, info, warn or error, got %q", c.Log.Level)
	}
	if c.Log.Format != "json" && c.Log.Format != "text" {
		p.add("log.format", "must be json or text, got %q", c.Log.Format)
	}
	if c.ConsistencyCheck.Enabled && c.ConsistencyCheck.Period < time.Second {
		p.add("consistencyCheck.period", "must be at least 1s, got %s", c.ConsistencyCheck.Period)
	}
	if c.ShutdownTimeout < time.Second {
		p.add("shutdownTimeout", "must be at least 1s, got %s", c.ShutdownTimeout)
	}
	if c.State.MaxPendingBytes < 1<<20 {
		p.add("state.maxPendingBytes", "must be at least 1048576 (1 MiB), got %d", c.State.MaxPendingBytes)
	}
	c.LeaderElection.validate(c.State, &p)
	c.Cluster.validate(&p)
	return errors.Join(p...)
}

// validateResources checks each resource and that none is configured twice, nor a group
// watched whole twice.
func (c *Config) validateResources(p *problems) {
	if len(c.Resources) == 0 {
		p.add("resources", "at least one resource must be configured")
	}
	seen, wholeGroups := map[string]int{}, map[string]int{}
	for i := range c.Resources {
		path := fmt.Sprintf("resources[%d]", i)
		r := &c.Resources[i]
		r.validate(path, p)
		if r.History.Enabled() && c.State.Path == "" {
			p.add(path+".history.retain", "a history is kept on disk, under state.path: set state.path")
		}
		id := strings.ToLower(r.String())
		first, dup := seen[id]
		whole, dupGroup := wholeGroups[r.Group]
		switch {
		case dup:
			p.add(path, "duplicate of resources[%d] (%s)", first, r)
		case r.IsWildcard() && dupGroup:
			p.add(path+".group", "%q is already watched whole by resources[%d]", r.Group, whole)
		case r.IsWildcard():
			wholeGroups[r.Group] = i
			seen[id] = i
		default:
			seen[id] = i
		}
	}
}

// validateSinks checks each sink of every kind, with its filters, and that no two share a name.
func (c *Config) validateSinks(p *problems) {
	env, err := celEnv()
	if err != nil {
		p.add("webhooks", "CEL environment: %v", err)
	}
	names := map[string]string{}
	index := map[string]int{}
	for _, s := range c.Sinks() {
		key := s.key()
		path := fmt.Sprintf("%s[%d]", key, index[key])
		index[key]++
		s.validate(path, c.Resources, env, p)
		name := s.Shared().Name
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			p.add(path+".name", "%s", strings.Join(errs, "; "))
		}
		if first, dup := names[name]; dup {
			p.add(path+".name", "duplicate of %s (%s): a sink's name is unique across webhooks, jetstream and kafka", first, name)
		} else {
			names[name] = path
		}
	}
}

func (r RateLimits) validate(p *problems) {
	for name, l := range map[string]RateLimit{"informers": r.Informers, "leaderElection": r.LeaderElection, "reviews": r.Reviews, "accessReviews": r.AccessReviews, "reads": r.Reads} {
		path := "client.rateLimits." + name
		if l.QPS <= 0 {
			p.add(path+".qps", "must be above 0, got %g", l.QPS)
		}
		if l.Burst < 1 {
			p.add(path+".burst", "must be at least 1, got %d", l.Burst)
		}
	}
}

func (l *LeaderElection) validate(state State, p *problems) {
	if !l.Enabled {
		return
	}
	if state.Path == "" {
		p.add("leaderElection.enabled", "needs state.path: followers keep what the leader may not have delivered in their outboxes")
	}
	for _, f := range []struct{ path, name string }{
		{"leaderElection.namespace", l.Namespace}, {"leaderElection.leaseName", l.LeaseName}, {"leaderElection.checkpointName", l.CheckpointName},
	} {
		if f.name == "" {
			p.add(f.path, "is required when leader election is enabled")
			continue
		}
		for _, msg := range validation.IsDNS1123Subdomain(f.name) {
			p.add(f.path, "%s", msg)
		}
	}
	if l.RetryPeriod < 100*time.Millisecond {
		p.add("leaderElection.retryPeriod", "must be at least 100ms, got %s", l.RetryPeriod)
	}
	// As client-go's leader election requires: renewals get retries within the deadline, and
	// the others wait longer than the leader may deliver.
	if float64(l.RenewDeadline) <= 1.2*float64(l.RetryPeriod) {
		p.add("leaderElection.renewDeadline", "must be more than 1.2 × retryPeriod (%s), got %s", l.RetryPeriod, l.RenewDeadline)
	}
	if l.LeaseDuration <= l.RenewDeadline {
		p.add("leaderElection.leaseDuration", "must be more than renewDeadline (%s): the difference is the fencing margin, got %s", l.RenewDeadline, l.LeaseDuration)
	}
	if l.CheckpointInterval < 100*time.Millisecond {
		p.add("leaderElection.checkpointInterval", "must be at least 100ms, got %s", l.CheckpointInterval)
	}
}

func checkAddress(path, addr string, p *problems) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		p.add(path, "must be host:port, got %q", addr)
	}
}

func (r *Resource) validate(path string, p *problems) {
	if r.Version == "" {
		p.add(path+".version", "is required")
	}
	r.validateName(path, p)
	r.validateWildcard(path, p)
	namespaces := map[string]bool{}
	for j, ns := range r.Namespaces {
		npath := fmt.Sprintf("%s.namespaces[%d]", path, j)
		for _, msg := range validation.IsDNS1123Label(ns) {
			p.add(npath, "%s", msg)
		}
		if namespaces[ns] {
			p.add(npath, "duplicate namespace %q", ns)
		}
		namespaces[ns] = true
	}
	r.validateExclusions(path, p)
	r.validateNamespaceSelector(path, p)
	var err error
	if r.Labels, err = labels.Parse(r.LabelSelector); err != nil {
		p.add(path+".labelSelector", "%v", err)
	}
	if r.Fields, err = fields.ParseSelector(r.FieldSelector); err != nil {
		p.add(path+".fieldSelector", "%v", err)
	}
	if r.StaleAfter < time.Second {
		p.add(path+".staleAfter", "must be at least 1s, got %s", r.StaleAfter)
	}
	if r.History.Retain < 0 {
		p.add(path+".history.retain", "must be 0 (no history) or a positive duration, got %s", r.History.Retain)
	}
	if r.History.Enabled() && r.History.MaxBytes < 1<<20 {
		p.add(path+".history.maxBytes", "must be at least 1048576 (1 MiB), got %d", r.History.MaxBytes)
	}
	if r.Resync != 0 && r.Resync < time.Second {
		p.add(path+".resync", "must be 0 (off) or at least 1s, got %s", r.Resync)
	}
	r.validateTransform(path, p)
	names := map[string]bool{}
	for j := range r.Indexers {
		ix := &r.Indexers[j]
		ipath := fmt.Sprintf("%s.indexers[%d]", path, j)
		ix.validate(ipath, p)
		if names[ix.Name] {
			p.add(ipath+".name", "duplicate indexer name %q", ix.Name)
		}
		names[ix.Name] = true
	}
	r.validateCache(path, p)
}

// validateName checks the group and the resource or kind that name the resource.
func (r *Resource) validateName(path string, p *problems) {
	if r.Group != "" {
		for _, msg := range validation.IsDNS1123Subdomain(r.Group) {
			p.add(path+".group", "%s", msg)
		}
	}
	switch {
	case r.Resource == "" && r.Kind == "":
		p.add(path, "one of resource or kind is required")
	case r.Resource != "" && r.Kind != "":
		p.add(path, "set resource or kind, not both")
	case r.IsWildcard():
	case r.Resource != "":
		for _, msg := range validation.IsDNS1123Label(r.Resource) {
			p.add(path+".resource", "%s", msg)
		}
	case r.Kind == Wildcard:
		p.add(path+".kind", `"*" is not a Kind: watch a whole API group with resource: "*"`)
	case !kindName.MatchString(r.Kind):
		p.add(path+".kind", "must be a Kind such as ConfigMap, got %q", r.Kind)
	}
}

// validateTransform parses the transform's removeFields paths.
func (r *Resource) validateTransform(path string, p *problems) {
	for j, text := range r.Transform.RemoveFields {
		fp, err := ParseFieldPath(text)
		if err != nil {
			p.add(fmt.Sprintf("%s.transform.removeFields[%d]", path, j), "%v", err)
			continue
		}
		r.Transform.Paths = append(r.Transform.Paths, fp)
	}
	if r.Transform.KeepSecretData && !r.IsSecrets() {
		p.add(path+".transform.keepSecretData", "only applies to core v1 secrets")
	}
}

// validateCache checks cache, and that with metadata only nothing needs the object's body.
func (r *Resource) validateCache(path string, p *problems) {
	switch r.Cache {
	case CacheFull:
		return
	case CacheMetadata:
	default:
		p.add(path+".cache", "must be %s or %s, got %q", CacheFull, CacheMetadata, r.Cache)
		return
	}
	const why = "reads the object's body, which cache: metadata does not keep"
	for j, fp := range r.Transform.Paths {
		if !fp.InMetadata() {
			p.add(fmt.Sprintf("%s.transform.removeFields[%d]", path, j), "%q %s: only metadata.* paths apply", fp, why)
		}
	}
	if r.Transform.KeepSecretData {
		p.add(path+".transform.keepSecretData", "keeps the secret's data, which cache: metadata does not keep")
	}
	for j, ix := range r.Indexers {
		if ix.JSONPath != nil && !ix.JSONPath.InMetadata() {
			p.add(fmt.Sprintf("%s.indexers[%d].path", path, j), "%q %s: only {.metadata...} paths apply, or an indexer of type label, annotation or owner", ix.Path, why)
		}
	}
}

func (ix *Indexer) validate(path string, p *problems) {
	switch {
	case ix.Name == NamespaceIndex:
		p.add(path+".name", "%q is reserved for the built-in namespace index", ix.Name)
	case !indexerName.MatchString(ix.Name):
		p.add(path+".name", "must start with a letter and contain only letters, digits, _ and -, got %q", ix.Name)
	}
	needKey, needPath := false, false
	switch ix.Type {
	case IndexLabel, IndexAnnotation:
		needKey = true
		for _, msg := range validation.IsQualifiedName(ix.Key) {
			p.add(path+".key", "%s", msg)
		}
	case IndexJSONPath:
		needPath = true
		jp, err := ParseJSONPath(ix.Path)
		if err != nil {
			p.add(path+".path", "%v", err)
		}
		ix.JSONPath = jp
	case IndexOwner:
	default:
		p.add(path+".type", "must be one of label, annotation, jsonPath, owner, got %q", ix.Type)
		return
	}
	if !needKey && ix.Key != "" {
		p.add(path+".key", "is not used by type %s", ix.Type)
	}
	if !needPath && ix.Path != "" {
		p.add(path+".path", "is not used by type %s", ix.Type)
	}
}

// validateNamespaceSelector checks and parses NamespaceSelector.
func (r *Resource) validateNamespaceSelector(at string, p *problems) {
	if r.NamespaceSelector == "" {
		return
	}
	if len(r.Namespaces) > 0 {
		p.add(at+".namespaceSelector", "cannot be set with namespaces: list the namespaces to watch, or select them by label")
	}
	sel, err := labels.Parse(r.NamespaceSelector)
	switch {
	case err != nil:
		p.add(at+".namespaceSelector", "%v", err)
	case sel.Empty():
		p.add(at+".namespaceSelector", "%q selects every namespace: leave it out to watch them all", r.NamespaceSelector)
	default:
		r.Namespaced = sel
	}
}

// validateExclusions checks and parses ExcludeNamespaces: each a namespace name or a glob
// that is not every namespace, none with Namespaces.
func (r *Resource) validateExclusions(at string, p *problems) {
	if len(r.ExcludeNamespaces) > 0 && len(r.Namespaces) > 0 {
		p.add(at+".excludeNamespaces", "cannot be set with namespaces: list the namespaces to watch, or those to leave out")
	}
	seen := map[string]bool{}
	for j, ns := range r.ExcludeNamespaces {
		npath := fmt.Sprintf("%s.excludeNamespaces[%d]", at, j)
		switch {
		case seen[ns]:
			p.add(npath, "duplicate %q", ns)
		case strings.Trim(ns, "*") == "":
			p.add(npath, "%q excludes every namespace: watch nothing by removing the resource instead", ns)
		case strings.ContainsAny(ns, "*?[\\"):
			if _, err := path.Match(ns, ""); err != nil {
				p.add(npath, "%q is not a valid glob (path.Match: *, ?, [a-z]): %v", ns, err)
			}
			r.ExcludedGlobs = append(r.ExcludedGlobs, ns)
		default:
			for _, msg := range validation.IsDNS1123Label(ns) {
				p.add(npath, "%s", msg)
			}
			r.ExcludedNames = append(r.ExcludedNames, ns)
		}
		seen[ns] = true
	}
}

// validateWildcard checks what a whole API group (resource: "*") needs and what only it may
// have: a group other than the core one, and ExcludeResources; version "*" only with it.
func (r *Resource) validateWildcard(at string, p *problems) {
	if !r.IsWildcard() {
		if r.Version == Wildcard {
			p.add(at+".version", `"*" (the preferred version of each resource) is only for a whole API group: set resource: "*" too, or name a version`)
		}
		if len(r.ExcludeResources) > 0 {
			p.add(at+".excludeResources", `only applies to a whole API group (resource: "*")`)
		}
		return
	}
	if r.Group == "" {
		p.add(at+".resource", `"*" watches a whole API group and needs group: the core group cannot be watched whole, list its resources instead`)
	}
	seen := map[string]bool{}
	for j, name := range r.ExcludeResources {
		rpath := fmt.Sprintf("%s.excludeResources[%d]", at, j)
		switch {
		case seen[name]:
			p.add(rpath, "duplicate %q", name)
		case name == Wildcard:
			p.add(rpath, `"*" excludes every resource: watch nothing by removing the entry instead`)
		default:
			for _, msg := range validation.IsDNS1123Label(name) {
				p.add(rpath, "must be a resource's plural name, such as widgets: %s", msg)
			}
		}
		seen[name] = true
	}
}
