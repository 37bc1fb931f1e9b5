package dynamicinformer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

// A whole group is a configured entry with resource "*": every resource its API group serves.
// Each discovery expands it into members, one per resource it selects, each an ordinary
// Resource named resource.version.group with the entry's settings, its own state, metrics
// series and informers. The entry itself runs no informer; its state says whether its group
// is served (Expanded) or not (NotServed).

// watchedOf lists what runs informers: each configured resource, and in place of a whole group
// its members. The Manager's mu must be held.
func watchedOf(entries []*Resource) []*Resource {
	out := make([]*Resource, 0, len(entries))
	for _, r := range entries {
		out = append(out, r.informed()...)
	}
	return out
}

// informed is what runs informers for the entry r: r, or a whole group's members. The
// Manager's mu must be held.
func (r *Resource) informed() []*Resource {
	if r.cfg.IsWildcard() {
		return r.members
	}
	return []*Resource{r}
}

// statusOf reports an entry: a resource, or a whole group followed by its members.
func (m *Manager) statusOf(r *Resource) []Status {
	if !r.cfg.IsWildcard() {
		return []Status{r.Status()}
	}
	m.mu.RLock()
	members := r.members
	m.mu.RUnlock()
	out := []Status{r.Status()}
	for _, x := range members {
		out[0].Members = append(out[0].Members, x.name)
		out = append(out, x.Status())
	}
	return out
}

// Listed reports whether every informer of the resource has delivered its initial list: not
// so for a member that became Stale before it could ever list, whose cache holds nothing.
func (r *Resource) Listed() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, ni := range r.informers {
		if !ni.controller.HasSynced() {
			return false
		}
	}
	return r.stop != nil
}

// syncingLocked is the state of a resource whose informers have not delivered their initial
// list: Syncing, or for a member of a whole group whose list has failed for longer than
// staleAfter (dynwatch may not list it, say), Stale, so that it holds back neither readiness
// nor the rest of its group.
func (r *Resource) syncingLocked() (State, string) {
	if r.parent != nil {
		if failing, why := r.failingLocked(); failing > r.cfg.StaleAfter {
			return StateStale, fmt.Sprintf("the initial list has failed for %s (staleAfter %s): %s", failing.Round(time.Second), r.cfg.StaleAfter, why)
		}
	}
	return StateSyncing, r.reason
}

// member is a resource a whole group selects, as discovery serves it.
type member struct {
	gvr schema.GroupVersionResource
	api metav1.APIResource
}

// selectMembers finds the resources of cfg's group that the whole group watches: each one the
// group serves at cfg's version or, with version "*", at the group's preferred version if that
// serves it, else at the first version discovery lists that does. Subresources are not
// resources; a resource without list and watch, in excludeResources, configured on its own
// (claimed: group resource → that entry's name), or cluster-scoped when namespaces are set is
// left out, and named with why in left. Both are in name order.
func selectMembers(s served, cfg *config.Resource, claimed map[schema.GroupResource]string) (members []member, left []string) {
	versions := []string{cfg.Version}
	if cfg.Version == config.Wildcard {
		versions = s.versions[cfg.Group]
	}
	decided := map[string]bool{}
	for _, v := range versions {
		gv := schema.GroupVersion{Group: cfg.Group, Version: v}
		for _, api := range s.resources[gv] {
			if strings.Contains(api.Name, "/") || decided[api.Name] {
				continue
			}
			decided[api.Name] = true
			if why := leftOut(cfg, api, claimed[gv.WithResource(api.Name).GroupResource()]); why != "" {
				left = append(left, fmt.Sprintf("%s (%s)", api.Name, why))
				continue
			}
			members = append(members, member{gvr: gv.WithResource(api.Name), api: api})
		}
	}
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.gvr.Resource, b.gvr.Resource) })
	slices.Sort(left)
	return members, left
}

// leftOut says why a whole group does not watch one of its group's resources, or "".
func leftOut(cfg *config.Resource, api metav1.APIResource, claimedBy string) string {
	switch {
	case slices.Contains(cfg.ExcludeResources, api.Name):
		return "excludeResources"
	case claimedBy != "":
		return "configured as " + claimedBy
	case !slices.Contains(api.Verbs, "list") || !slices.Contains(api.Verbs, "watch"):
		return "no list and watch"
	case !api.Namespaced && (len(cfg.Namespaces) > 0 || len(cfg.ExcludeNamespaces) > 0 || cfg.NamespaceSelector != ""):
		return "cluster-scoped, and namespaces, excludeNamespaces or namespaceSelector are set"
	}
	return ""
}

// expandGroups matches every whole group with what discovery found, adds the members it
// watches to byGVR, which already holds the resources configured alone, and publishes byGVR.
// A member that is new starts; one whose configuration a reload changed restarts; one no
// longer selected stops. Of those, one whose resource is still watched (at another version,
// or configured alone) stops quietly; the others are retired: what their caches still held
// leaves as DELETED.
func (m *Manager) expandGroups(ctx context.Context, s served, byGVR map[schema.GroupVersionResource]*Resource) {
	claimed := map[schema.GroupResource]string{}
	for gvr, r := range byGVR {
		claimed[gvr.GroupResource()] = r.name
	}
	next := map[*Resource][]*Resource{}
	var stopped, retired []*Resource
	for _, e := range m.entries() {
		if !e.cfg.IsWildcard() {
			continue
		}
		m.mu.RLock()
		current := e.members
		m.mu.RUnlock()
		if failed := s.groupFailed(e.cfg.Group); failed != "" {
			// What the group serves is unknown: its members stay as they are.
			e.mu.Lock()
			e.lastError = failed
			e.mu.Unlock()
			for _, x := range current {
				byGVR[x.cfg.GroupVersionResource()] = x
			}
			next[e] = current
			continue
		}
		members, left := selectMembers(s, e.cfg, claimed)
		var stop []*Resource
		next[e], stop = m.expand(ctx, e, members, current, byGVR)
		kept, gone := stillWatched(stop, claimed, members)
		stopped, retired = append(stopped, kept...), append(retired, gone...)
		e.setState(groupState(s, e.cfg, len(members), left))
	}
	m.mu.Lock()
	for e, members := range next {
		e.members = members
	}
	m.byGVR, m.watched = byGVR, watchedOf(m.resources)
	m.mu.Unlock()
	var gone []string
	for _, x := range stopped {
		x.stopInformers()
		gone = append(gone, x.name)
	}
	for _, x := range retired {
		x.retire()
		gone = append(gone, x.name)
	}
	m.forget(gone...)
}

// stillWatched splits the members a group stops into those whose resource is still watched,
// by another entry or as another version (kept: only their informers stop), and the others
// (gone: retired, their objects handed out as deleted).
func stillWatched(stop []*Resource, claimed map[schema.GroupResource]string, members []member) (kept, gone []*Resource) {
	watched := map[schema.GroupResource]bool{}
	for gr := range claimed {
		watched[gr] = true
	}
	for _, x := range members {
		watched[x.gvr.GroupResource()] = true
	}
	for _, x := range stop {
		if watched[x.cfg.GroupVersionResource().GroupResource()] {
			kept = append(kept, x)
		} else {
			gone = append(gone, x)
		}
	}
	return kept, gone
}

// expand starts the members of e that are new or whose configuration changed, and returns
// e's members as they are now, and those of current no longer among them.
func (m *Manager) expand(ctx context.Context, e *Resource, members []member, current []*Resource, byGVR map[schema.GroupVersionResource]*Resource) (next, stop []*Resource) {
	byName := map[string]*Resource{}
	for _, x := range current {
		byName[x.name] = x
	}
	for _, w := range members {
		name := object.ResourceName(w.gvr)
		x, ok := byName[name]
		delete(byName, name)
		if ok && x.cfg.Source != e.cfg.Source { // reconfigured by a reload
			x.stopInformers()
			ok = false
		}
		if !ok {
			x = m.newResource(e.cfg.Member(w.gvr.Version, w.gvr.Resource))
			x.parent = e
		}
		if !x.running() {
			if err := x.start(ctx, m.dynamic, w.gvr, w.api); err != nil {
				x.setState(StateInvalid, err.Error())
			}
		}
		byGVR[w.gvr] = x
		next = append(next, x)
	}
	for _, x := range current {
		if _, ok := byName[x.name]; ok {
			stop = append(stop, x)
		}
	}
	return next, stop
}

// groupState is a whole group's state and its reason: NotServed when discovery finds none of
// its resources, else Expanded; the reason names the resources left out and why.
func groupState(s served, cfg *config.Resource, members int, left []string) (State, string) {
	reason := ""
	if len(left) > 0 {
		reason = "left out: " + strings.Join(left, ", ")
	}
	switch {
	case members > 0:
		return StateExpanded, reason
	case len(s.versions[cfg.Group]) == 0:
		return StateNotServed, fmt.Sprintf("the server does not serve API group %q", cfg.Group)
	case cfg.Version != config.Wildcard && s.resources[cfg.GroupVersion()] == nil:
		return StateNotServed, fmt.Sprintf("the server does not serve API group version %q", cfg.GroupVersion())
	}
	return StateNotServed, strings.TrimSpace(fmt.Sprintf("the server serves no resource of API group %q that this entry watches; %s", cfg.Group, reason))
}

// groupFailed says why discovery of one of group's versions failed, or "".
func (s served) groupFailed(group string) string {
	for gv := range s.failed {
		if gv.Group == group {
			return fmt.Sprintf("discovery of %s failed: its resources are kept as they were", gv)
		}
	}
	return ""
}

// retire stops a member that is no longer watched and hands the subscribers, as DELETED, every
// object its cache still held: for dynwatch's consumers those objects are gone. (When a CRD is
// deleted, the apiserver deletes its objects first and the watch has usually reported them.)
// The events carry no Revision: when the objects went is not known.
func (r *Resource) retire() {
	r.mu.RLock()
	st, gvr := r.store, r.gvr
	r.mu.RUnlock()
	r.stopInformers()
	if st == nil {
		return
	}
	var gone []*object.Object
	st.current().Scan("", Key{}, func(u *object.Object) bool {
		gone = append(gone, u)
		return true
	})
	for _, u := range gone {
		stream := metav1.NamespaceAll
		if len(r.cfg.Namespaces) > 0 {
			stream = u.GetNamespace()
		}
		r.emit(object.Event{Type: object.Deleted, Resource: gvr, Object: u, Stream: stream})
	}
	r.m.logger().Info("resource no longer watched: its cached objects were handed out as deleted", "resource", r.name, "objects", len(gone))
}

// forget drops the metric series of resources that are no longer watched.
func (m *Manager) forget(names ...string) {
	watched := map[string]bool{}
	for _, r := range m.Resources() {
		watched[r.name] = true
	}
	for _, name := range names {
		if !watched[name] {
			m.met.forget(name)
		}
	}
}
