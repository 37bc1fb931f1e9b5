package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// pairwise compares every key of a configmap with every other: quadratic in its keys, so a
// tenant who may write the configmap can push it past the filter's cost limit.
const pairwise = `object.data.all(a, object.data.all(b, a == b || object.data[a] != object.data[b]))`

// TestAFilterThatCannotDecideLosesNothingSilently: a configmap grown to 1,000 keys makes a
// pairwise filter exceed its cost limit. With the default filterErrors the event is in the
// sink's dead letters with reason filterError and a log line names the object; with deliver
// the receiver gets it, flagged with the CloudEvents extension attribute filtererror. A small
// configmap, which the filter decides on, reaches both as before.
func TestAFilterThatCannotDecideLosesNothingSilently(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	guarded := newReceiver(t, nil, false)
	flagged := newReceiver(t, nil, false)
	deadLetters := filepath.Join(t.TempDir(), "dead.jsonl")
	p := start(t, cluster.Kubeconfig, plainConfig(ns, fmt.Sprintf(`webhooks:
  - {name: guarded, url: %s, filter: %q, deadLetter: {file: %s}}
  - {name: flagged, url: %s, filter: %q, filterErrors: deliver}`, guarded.URL, pairwise, deadLetters, flagged.URL, pairwise)))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	create := func(name string, keys int) {
		t.Helper()
		data := map[string]string{}
		for i := range keys {
			data["k"+strconv.Itoa(i)] = strconv.Itoa(i)
		}
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create("small", 3)
	create("big", 1000)

	var rec struct {
		Reason, Error, Type string
		Object              struct{ Namespace, Name string }
	}
	testbed.Eventually(t, 30*time.Second, func() error {
		b, err := os.ReadFile(deadLetters)
		if err != nil {
			return err
		}
		if len(b) == 0 {
			return errors.New("no dead letter yet")
		}
		return json.Unmarshal(b, &rec)
	})
	if rec.Reason != "filterError" || rec.Object.Name != "big" || rec.Object.Namespace != ns || !strings.Contains(rec.Error, "cost limit") {
		t.Errorf("dead letter %+v; want reason filterError for %s/big with the cost limit's error", rec, ns)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := p.WaitLog(ctx, `"name":"big"`); err != nil || !strings.Contains(p.Log(), "the filter could not decide on an event") {
		t.Errorf("no log line names big as an event the filter could not decide on (%v)", err)
	}

	got := flagged.waitFor(t, 2, 30*time.Second)
	flags := map[string]string{}
	for _, r := range got {
		flags[r.name()] = r.header.Get("ce-filtererror")
	}
	if flags["small"] != "" || !strings.Contains(flags["big"], "cost%20limit") {
		t.Errorf("the deliver sink's ce-filtererror by object: %q; want none for small and the cost limit's error for big", flags)
	}
	if names := guarded.waitFor(t, 1, 30*time.Second); len(names) != 1 || names[0].name() != "small" {
		t.Errorf("the default sink received %d events; want small only", len(names))
	}
}
