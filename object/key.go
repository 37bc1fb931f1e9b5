package object

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Key is an object's key in the cache: namespace/name, or name for a cluster-scoped object.
func Key(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// Named is what names an object: its namespace ("" when cluster-scoped) and name. Kubernetes
// objects, decoded or not, have both.
type Named interface {
	GetNamespace() string
	GetName() string
}

// KeyOf is o's key in the cache.
func KeyOf(o Named) string { return Key(o.GetNamespace(), o.GetName()) }

// IsKeyOf reports whether key is the key of namespace and name, without building it.
func IsKeyOf(key, namespace, name string) bool {
	if namespace == "" {
		return key == name
	}
	return len(key) == len(namespace)+1+len(name) && key[len(namespace)] == '/' &&
		strings.HasPrefix(key, namespace) && strings.HasSuffix(key, name)
}

// SplitKey is the namespace ("" for a cluster-scoped object) and name of a key.
func SplitKey(key string) (namespace, name string) {
	if ns, n, ok := strings.Cut(key, "/"); ok {
		return ns, n
	}
	return "", key
}

// Compare orders objects as the apiserver lists them: by namespace, then name; cluster-scoped
// objects (no namespace) first.
func Compare(aNamespace, aName, bNamespace, bName string) int {
	if c := strings.Compare(aNamespace, bNamespace); c != 0 {
		return c
	}
	return strings.Compare(aName, bName)
}

// CompareKeys orders two keys as Compare orders their objects.
func CompareKeys(a, b string) int {
	ans, an := SplitKey(a)
	bns, bn := SplitKey(b)
	return Compare(ans, an, bns, bn)
}

// CompareObjects orders two objects as Compare does.
func CompareObjects[T Named](a, b T) int {
	return Compare(a.GetNamespace(), a.GetName(), b.GetNamespace(), b.GetName())
}

// Revision is a resourceVersion as an integer, or 0 when it is not one. One resource's
// resourceVersions compare as integers (the apiserver's are etcd revisions).
func Revision(resourceVersion string) uint64 {
	n, err := strconv.ParseUint(resourceVersion, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// After is the revision just after rev: the lowest a change to an object last seen at rev
// can have. 0 stays 0 (not known).
func After(rev uint64) uint64 {
	if rev == 0 {
		return 0
	}
	return rev + 1
}

// ResourceName names gvr as dynwatch does everywhere: resource.version.group, or
// resource.version for the core group.
func ResourceName(gvr schema.GroupVersionResource) string {
	if gvr.Group == "" {
		return gvr.Resource + "." + gvr.Version
	}
	return gvr.Resource + "." + gvr.Version + "." + gvr.Group
}

// ParseResourceName is the resource ResourceName named. The resource and the version must be
// DNS labels and the group, if any, a DNS subdomain, as the apiserver requires.
func ParseResourceName(name string) (schema.GroupVersionResource, error) {
	resource, rest, _ := strings.Cut(name, ".")
	version, group, _ := strings.Cut(rest, ".")
	bad := len(validation.IsDNS1123Label(resource)) > 0 || len(validation.IsDNS1123Label(version)) > 0 ||
		group != "" && len(validation.IsDNS1123Subdomain(group)) > 0
	if bad {
		return schema.GroupVersionResource{}, fmt.Errorf("resource %q is not resource.version.group", name)
	}
	return schema.GroupVersionResource{Group: group, Version: version, Resource: resource}, nil
}

// OrderingKey orders an object's deliveries: its resource, namespace and name. An object
// deleted and created again under its name keeps its ordering key, whatever its uid.
func OrderingKey(gvr schema.GroupVersionResource, namespace, name string) string {
	return ResourceName(gvr) + "|" + Key(namespace, name)
}

// OrderingKeyNamespace is the namespace of an ordering key: "" for a cluster-scoped object's,
// and for a key OrderingKey did not make.
func OrderingKeyNamespace(key string) string {
	_, k, ok := strings.Cut(key, "|")
	if !ok {
		return ""
	}
	ns, _ := SplitKey(k)
	return ns
}

// OrderingKeyResource is the resource of an ordering key.
func OrderingKeyResource(key string) (schema.GroupVersionResource, error) {
	name, _, ok := strings.Cut(key, "|")
	if !ok {
		return schema.GroupVersionResource{}, fmt.Errorf("ordering key %q has no resource", key)
	}
	return ParseResourceName(name)
}
