package httpapi

import (
	"net/http"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
)

// readVerbs are the verbs dynwatch serves for every watched resource.
var readVerbs = metav1.Verbs{"get", "list", "watch"}

// served lists the running resources, by group version, as discovery entries.
func (a *api) served() map[schema.GroupVersion][]metav1.APIResource {
	out := map[schema.GroupVersion][]metav1.APIResource{}
	for _, r := range a.Informers.Resources() {
		gvr, res, running := r.API()
		if !running {
			continue
		}
		gv := gvr.GroupVersion()
		out[gv] = append(out[gv], metav1.APIResource{
			Name:         res.Name,
			SingularName: res.SingularName,
			Namespaced:   res.Namespaced,
			Kind:         res.Kind,
			Verbs:        readVerbs,
			ShortNames:   res.ShortNames,
			Categories:   res.Categories,
		})
	}
	return out
}

// discovery answers /api, /api/v1, /apis, /apis/{group} and /apis/{group}/{version} with the
// watched resources only, in the legacy (unaggregated) discovery format, which clients fall
// back to when they ask for the aggregated one.
func (a *api) discovery(w http.ResponseWriter, t target) {
	served := a.served()
	switch {
	case t.discovery == "root" && t.legacy:
		versions := []string{}
		if _, ok := served[schema.GroupVersion{Version: "v1"}]; ok {
			versions = append(versions, "v1")
		}
		writeJSON(w, http.StatusOK, &metav1.APIVersions{
			TypeMeta: metav1.TypeMeta{Kind: "APIVersions"},
			Versions: versions,
		})
	case t.discovery == "root":
		list := &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{}}
		for _, group := range groups(served) {
			list.Groups = append(list.Groups, apiGroup(group, served))
		}
		writeJSON(w, http.StatusOK, list)
	case t.discovery == "group":
		g := apiGroup(t.gv.Group, served)
		if len(g.Versions) == 0 || t.gv.Group == "" {
			writeStatus(w, notServed())
			return
		}
		g.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
		writeJSON(w, http.StatusOK, &g)
	default: // a group version
		resources, ok := served[t.gv]
		if !ok || (t.legacy != (t.gv.Group == "")) {
			writeStatus(w, notServed())
			return
		}
		slices.SortFunc(resources, func(a, b metav1.APIResource) int { return strings.Compare(a.Name, b.Name) })
		writeJSON(w, http.StatusOK, &metav1.APIResourceList{
			TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: t.gv.String(),
			APIResources: resources,
		})
	}
}

// groups returns the named groups served, sorted.
func groups(served map[schema.GroupVersion][]metav1.APIResource) []string {
	var out []string
	for gv := range served {
		if gv.Group != "" && !slices.Contains(out, gv.Group) {
			out = append(out, gv.Group)
		}
	}
	slices.Sort(out)
	return out
}

func apiGroup(group string, served map[schema.GroupVersion][]metav1.APIResource) metav1.APIGroup {
	g := metav1.APIGroup{Name: group}
	for gv := range served {
		if gv.Group == group {
			g.Versions = append(g.Versions, metav1.GroupVersionForDiscovery{GroupVersion: gv.String(), Version: gv.Version})
		}
	}
	slices.SortFunc(g.Versions, func(a, b metav1.GroupVersionForDiscovery) int {
		return version.CompareKubeAwareVersionStrings(b.Version, a.Version) // preferred (highest) first
	})
	if len(g.Versions) > 0 {
		g.PreferredVersion = g.Versions[0]
	}
	return g
}
