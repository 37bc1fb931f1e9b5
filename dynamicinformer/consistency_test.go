package dynamicinformer

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// TestACacheChangedBehindTheInformersBackIsFoundListedAgainAndRepaired: the check finds an
// object the cache lost, one it holds at an older resourceVersion and one the apiserver never
// had; it counts a failure, names the three in /status, and makes the informer list again,
// which hands the subscribers the three changes that put the cache right; the next check passes.
func TestACacheChangedBehindTheInformersBackIsFoundListedAgainAndRepaired(t *testing.T) {
	testbed.Need(t)
	ns := namespaces(t, 1)[0]
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	for _, name := range []string{"lost", "older", "kept"} {
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rec := &recorder{}
	m := startManager(t, cluster.Config, fmt.Sprintf("resources: [{version: v1, resource: configmaps, namespaces: [%s]}]\nconsistencyCheck: {period: 1s}\n", ns), rec)
	r := resource(t, m, "configmaps.v1")
	cacheHas(t, r, ns+"/lost", ns+"/older", ns+"/kept")
	testbed.Eventually(t, 20*time.Second, func() error {
		if got := metricValue(t, m, "dynwatch_informer_consistency_checks_total", "configmaps.v1", CheckSuccess); got < 1 {
			return fmt.Errorf("%v checks passed, want one before the cache is changed", got)
		}
		return nil
	})

	older, lost := mustGet(t, r, ns, "older"), mustGet(t, r, ns, "lost")
	r.mu.RLock()
	st := r.store
	r.mu.RUnlock()
	st.mu.Lock()
	st.removeLocked(lost)
	st.setLocked(object.New(&unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"namespace": ns, "name": "ghost", "resourceVersion": "1"}}}))
	stale := decoded(t, older)
	stale.SetResourceVersion("2")
	st.setLocked(object.New(stale))
	st.mu.Unlock()

	testbed.Eventually(t, 20*time.Second, func() error {
		c := r.Status().Consistency
		if c == nil || c.LastFailureTime == nil {
			return fmt.Errorf("consistency %+v: no failure yet", c)
		}
		return nil
	})
	if got := metricValue(t, m, "dynwatch_informer_consistency_checks_total", "configmaps.v1", CheckFailure); got < 1 {
		t.Errorf("%v failures counted, want at least 1", got)
	}
	// The repair: the list's differences with the cache, as events.
	testbed.Eventually(t, 20*time.Second, func() error {
		for name, want := range map[string]object.EventType{"lost": object.Added, "ghost": object.Deleted, "older": object.Modified} {
			events := rec.find(ns, name)
			if len(events) == 0 || events[len(events)-1].Type != want {
				return fmt.Errorf("%s's events %s, want the last %s", name, typesOf(events), want)
			}
		}
		return nil
	})
	if e := rec.find(ns, "older"); e[len(e)-1].Object.GetResourceVersion() != older.GetResourceVersion() {
		t.Errorf("older repaired to resourceVersion %s, want %s", e[len(e)-1].Object.GetResourceVersion(), older.GetResourceVersion())
	}
	cacheHas(t, r, ns+"/lost", ns+"/older", ns+"/kept")
	testbed.Eventually(t, 20*time.Second, func() error {
		if c := r.Status().Consistency; c.Result != CheckSuccess || c.LastCheckTime.Before(*c.LastFailureTime) || c.LastCheckTime.Equal(*c.LastFailureTime) {
			return fmt.Errorf("consistency %+v: no check has passed since the failure", c)
		}
		return nil
	})
	log := m.logsOf()
	for _, want := range []string{ns + "/lost: cache none, apiserver ", ns + "/ghost: cache 1, apiserver none", ns + "/older: cache 2, apiserver " + older.GetResourceVersion()} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not name %q", want)
		}
	}
}

// TestConsistencyChecksOfCachesUnderWritesFindNothing: with a write every few milliseconds to
// both namespaces of a resource, every check compares each cache at its own resourceVersion
// and passes.
func TestConsistencyChecksOfCachesUnderWritesFindNothing(t *testing.T) {
	testbed.Need(t)
	nss := namespaces(t, 2)
	m := startManager(t, cluster.Config, fmt.Sprintf("resources: [{version: v1, resource: configmaps, namespaces: [%s, %s]}]\nconsistencyCheck: {period: 1s}\n", nss[0], nss[1]))
	waitReady(t, m)
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	for i := 0; ; i++ {
		ns, name := nss[i%2], fmt.Sprintf("cm-%d", i%20)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"i": fmt.Sprint(i)}}
		var err error
		switch {
		case i < 20:
			_, err = cs.CoreV1().ConfigMaps(ns).Create(t.Context(), cm, metav1.CreateOptions{})
		case i%7 == 0:
			err = cs.CoreV1().ConfigMaps(ns).Delete(t.Context(), name, metav1.DeleteOptions{})
			if err == nil {
				_, err = cs.CoreV1().ConfigMaps(ns).Create(t.Context(), cm, metav1.CreateOptions{})
			}
		default:
			_, err = cs.CoreV1().ConfigMaps(ns).Update(t.Context(), cm, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
		if metricValue(t, m, "dynwatch_informer_consistency_checks_total", "configmaps.v1", CheckSuccess) >= 5 {
			break
		}
	}
	for _, result := range []string{CheckFailure, CheckError} {
		if got := metricValue(t, m, "dynwatch_informer_consistency_checks_total", "configmaps.v1", result); got != 0 {
			t.Errorf("%v checks ended %s, want none: %+v", got, result, resource(t, m, "configmaps.v1").Status().Consistency)
		}
	}
}

func mustGet(t *testing.T, r *Resource, namespace, name string) *object.Object {
	t.Helper()
	u, ok := r.Get(namespace, name)
	if !ok {
		t.Fatalf("%s/%s is not cached", namespace, name)
	}
	return u
}

func typesOf(events []object.Event) string {
	var s []string
	for _, e := range events {
		s = append(s, string(e.Type))
	}
	return strings.Join(s, ",")
}
