package e2e

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/dynwatch/dynwatch/test/validate"
)

// attributor works out, from the objects of the apiserver's own watch, who made each version
// (validate.Attribution), as package validate defines it and independently of dynwatch's code:
// from each version's managedFields and the version before.
type attributor struct {
	mu   sync.Mutex
	prev map[string][]metav1.ManagedFieldsEntry
	out  map[string]validate.Attribution
}

func newAttributor() *attributor {
	return &attributor{prev: map[string][]metav1.ManagedFieldsEntry{}, out: map[string]validate.Attribution{}}
}

// see notes the version u of a watch event of type typ.
func (a *attributor) see(typ watch.EventType, key string, rev uint64, u *unstructured.Unstructured) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if typ == watch.Deleted {
		delete(a.prev, key)
		return
	}
	cur := u.GetManagedFields()
	before := map[string]metav1.ManagedFieldsEntry{}
	for _, e := range a.prev[key] {
		before[e.Manager+"|"+string(e.Operation)+"|"+e.Subresource] = e
	}
	var changed, fields, present []string
	for _, e := range cur {
		present = append(present, e.Manager)
		b, ok := before[e.Manager+"|"+string(e.Operation)+"|"+e.Subresource]
		switch {
		case !ok || !b.Time.Equal(e.Time) || b.APIVersion != e.APIVersion:
			changed = append(changed, e.Manager)
		case !bytes.Equal(rawFields(b), rawFields(e)):
			fields = append(fields, e.Manager)
		}
	}
	if len(changed) == 0 {
		changed = fields
	}
	a.out[validate.Version(key, rev)] = validate.Attribution{Changed: names(changed), Present: names(present)}
	a.prev[key] = cur
}

func rawFields(e metav1.ManagedFieldsEntry) []byte {
	if e.FieldsV1 == nil {
		return nil
	}
	return e.FieldsV1.GetRawBytes()
}

// names are ns sorted, without repeats, joined by commas.
func names(ns []string) string {
	slices.Sort(ns)
	return strings.Join(slices.Compact(ns), ",")
}

// attribution is what a has worked out so far.
func (a *attributor) attribution() map[string]validate.Attribution {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]validate.Attribution, len(a.out))
	for k, v := range a.out {
		out[k] = v
	}
	return out
}

// namedManagers are the managers an event's body names (its "managers"), as
// validate.Delivery's Managers, and whether it names them at all.
func namedManagers(body []byte) (string, bool) {
	var ev struct {
		Managers *[]struct {
			Manager string `json:"manager"`
		} `json:"managers"`
	}
	if json.Unmarshal(body, &ev) != nil || ev.Managers == nil {
		return "", false
	}
	var ns []string
	for _, m := range *ev.Managers {
		ns = append(ns, m.Manager)
	}
	return names(ns), true
}
