package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// TestExcludedNamespacesReachNeitherTheCacheNorTheSinks watches configmaps cluster-wide,
// leaving out one namespace by name (the apiserver's field selector) and two by a glob
// (dynwatch's filter): the query API and a webhook see the objects of the kept namespace
// only, those created before the start and after it.
func TestExcludedNamespacesReachNeitherTheCacheNorTheSinks(t *testing.T) {
	t.Parallel()
	kept, byName := namespace(t), namespace(t)
	prefix := strings.TrimSuffix(byName, byName[strings.LastIndexByte(byName, '-'):]) // the test's name
	glob := prefix + "-glob-*"
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	var byGlob []string
	for i := range 2 {
		ns := fmt.Sprintf("%s-glob-%d", prefix, i)
		if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		byGlob = append(byGlob, ns)
	}
	label := "exclude-test=" + kept // only this test's objects enter the cache
	create := func(phase string) {
		for _, ns := range append([]string{kept, byName}, byGlob...) {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: phase, Labels: map[string]string{"exclude-test": kept}}}
			if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	create("before")
	rc := newReceiver(t, nil, false)
	p, metrics := startWithWebhooks(t, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, labelSelector: %q, excludeNamespaces: [%s, %q]}]
webhooks: [{name: all, url: %q}]
`, label, byName, glob, rc.URL))
	create("after")
	want := []string{kept + "/after", kept + "/before"}

	api, _, _ := p.WaitListening(t.Context())
	testbed.Eventually(t, time.Minute, func() error {
		code, body, err := get(t.Context(), api+"/api/v1/configmaps?labelSelector="+label)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("list: %d %s", code, body)
		}
		var list corev1.ConfigMapList
		if err := json.Unmarshal([]byte(body), &list); err != nil {
			return err
		}
		var got []string
		for _, cm := range list.Items {
			got = append(got, cm.Namespace+"/"+cm.Name)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return fmt.Errorf("dynwatch lists %v, want %v", got, want)
		}
		return nil
	})
	// The informers made exactly two events, so the webhook gets no more than their two.
	if n := metricValue(t, metrics, `dynwatch_informer_events_total{resource="configmaps.v1",type="ADDED"}`); n != float64(len(want)) {
		t.Errorf("the informers made %v ADDED events, want %d", n, len(want))
	}
	rc.waitFor(t, len(want), time.Minute)
	var got []string
	for _, r := range rc.got() {
		got = append(got, r.subject)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("the webhook received %v, want %v", got, want)
	}
}
