package httpapi

import (
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
)

// metadataFields are the fields every namespaced kind without conversion rules of its own
// accepts (runtime.DefaultMetaV1FieldSelectorConversion).
var metadataFields = []string{"metadata.name", "metadata.namespace"}

// builtinFields are the field selectors kube-apiserver v1.36 accepts per built-in kind, from
// its field label conversion functions; a kind not listed accepts metadataFields. A value
// other than the field's own path names where the value is found in the object (core
// Events' "source" is source.component).
var builtinFields = map[schema.GroupKind]map[string]string{
	{Kind: "Pod"}: fieldSet("metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
		"spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs", "status.nominatedNodeName"),
	{Kind: "Node"}:                  fieldSet("metadata.name", "spec.unschedulable"),
	{Kind: "ReplicationController"}: fieldSet("metadata.name", "metadata.namespace", "status.replicas"),
	{Kind: "Namespace"}:             fieldSet("metadata.name", "status.phase"),
	{Kind: "Secret"}:                fieldSet("metadata.name", "metadata.namespace", "type"),
	{Kind: "Service"}:               fieldSet("metadata.name", "metadata.namespace", "spec.clusterIP", "spec.type"),
	{Kind: "Event"}: withPaths(fieldSet("metadata.name", "metadata.namespace", "involvedObject.kind", "involvedObject.namespace",
		"involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
		"involvedObject.fieldPath", "reason", "reportingComponent", "type"), "source", "source.component"),
	{Group: "events.k8s.io", Kind: "Event"}: fieldSet("metadata.name", "metadata.namespace", "reason", "regarding.kind", "regarding.namespace",
		"regarding.name", "regarding.uid", "regarding.apiVersion", "regarding.resourceVersion", "regarding.fieldPath",
		"reportingController", "type"),
	{Group: "batch", Kind: "Job"}:                                     fieldSet("metadata.name", "metadata.namespace", "status.successful"),
	{Group: "certificates.k8s.io", Kind: "CertificateSigningRequest"}: fieldSet("metadata.name", "spec.signerName"),
	{Group: "resource.k8s.io", Kind: "ResourceSlice"}:                 fieldSet("metadata.name", "spec.nodeName", "spec.driver"),
}

func fieldSet(fields ...string) map[string]string {
	m := make(map[string]string, len(fields))
	for _, f := range fields {
		m[f] = f
	}
	return m
}

func withPaths(m map[string]string, fieldAndPath ...string) map[string]string {
	for i := 0; i+1 < len(fieldAndPath); i += 2 {
		m[fieldAndPath[i]] = fieldAndPath[i+1]
	}
	return m
}

// selectable says which field selectors one resource accepts, and where each field's value
// is found in its objects.
type selectable struct {
	any      bool              // api.fieldSelectors any: every dot path
	fields   map[string]string // field → its dot path in the object
	metadata bool              // cache: metadata: only metadata.* fields, whatever the rest says
}

// selectableFields are the fields the apiserver accepts for gk (with a CRD's own
// selectableFields when gk is one), plus the paths of cfg's jsonPath indexers, which the
// operator declared queryable.
func selectableFields(gk schema.GroupKind, crdFields []string, cfg *config.Resource, anyPath bool) selectable {
	if anyPath {
		return selectable{any: true, metadata: cfg.MetadataOnly()}
	}
	s := selectable{fields: map[string]string{}, metadata: cfg.MetadataOnly()}
	base, ok := builtinFields[gk]
	if !ok {
		base = fieldSet(metadataFields...)
	}
	for f, p := range base {
		s.fields[f] = p
	}
	for _, f := range crdFields {
		s.fields[f] = f
	}
	for _, ix := range cfg.Indexers {
		if ix.Type == config.IndexJSONPath {
			if p, ok := config.DotPath(ix.Path); ok {
				s.fields[p] = p
			}
		}
	}
	return s
}

// path returns the dot path field selects, or a 400 naming the field when the resource does
// not accept it, as the apiserver words it.
func (s selectable) path(field string) ([]string, *apierrors.StatusError) {
	if s.metadata && !strings.HasPrefix(field, "metadata.") {
		return nil, badParameter("fieldSelector", "%s: this resource's cache keeps the metadata of its objects only (cache: metadata)", field)
	}
	if s.any {
		return strings.Split(field, "."), nil
	}
	p, ok := s.fields[field]
	if !ok {
		accepted := make([]string, 0, len(s.fields))
		for f := range s.fields {
			accepted = append(accepted, f)
		}
		slices.Sort(accepted)
		return nil, badParameter("fieldSelector", "field label not supported: %s (this resource accepts %s; api.fieldSelectors: any selects on any path)", field, strings.Join(accepted, ", "))
	}
	return strings.Split(p, "."), nil
}
