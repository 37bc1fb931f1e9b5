package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/runner"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// The big tenant's configmap: this many keys of about 22 bytes each, about 900 KB, replaced
// once a second for this long.
const (
	bigKeys    = 40_000
	bigReplace = 30 * time.Second
)

// TestOneTenantsBigObjectHoldsUpNoOneElse: a tenant replaces a 900 KB, 40,000-key configmap
// once a second for 30 s; six sinks receive it, four through filters that walk its keys (one
// comparing each with the old object's, one pairwise, past its cost limit). Another tenant's configmap, changed five times a second, reaches
// its own sink with a p99 under 250 ms from update to receipt. The log reports dynwatch's CPU
// time per replacement.
//
// It runs alone (no t.Parallel): what it measures is one tenant's cost to the others.
func TestOneTenantsBigObjectHoldsUpNoOneElse(t *testing.T) {
	testbed.Need(t)
	big, other := namespace(t), namespace(t)
	ok := func(received, int, http.Header) int { return http.StatusOK }
	mine := newJudge(t, ok)
	var sinks []string
	for i, filter := range []string{
		`object.data.all(k, size(k) < 64 && size(object.data[k]) < 64)`,
		`!object.data.exists(k, k.startsWith("forbidden") || object.data[k].contains("secret"))`,
		`type != "MODIFIED" || object.data.exists(k, !(k in oldObject.data) || oldObject.data[k] != object.data[k])`,
		pairwise,
		"",
	} {
		line := fmt.Sprintf("  - {name: s%d, url: %s", i, newDiscard(t).URL)
		if filter != "" {
			line += fmt.Sprintf(", filter: %q, filterErrors: drop", filter)
		}
		sinks = append(sinks, line+"}")
	}
	sinks = append(sinks, fmt.Sprintf("  - {name: other, url: %s, namespaces: [%s]}", mine.URL, other))
	// The binary without the race detector: its CPU time is what a cluster would see, where
	// the race detector's is several times that and would measure the detector.
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, fmt.Sprintf(`
resources: [{version: v1, resource: configmaps, namespaces: [%s, %s]}]
webhooks:
%s
state: {path: %s/state.db}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, big, other, strings.Join(sinks, "\n"), t.TempDir()))
	p := startReady(t, runner.Options{Binary: plainBinary(t), Config: path})
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	data := make(map[string]string, bigKeys)
	for i := range bigKeys {
		data[fmt.Sprintf("key-%06d", i)] = fmt.Sprintf("value-%06d", i)
	}
	for _, cm := range []*corev1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Namespace: big, Name: "big"}, Data: data},
		{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "other"}},
	} {
		if _, err := cs.CoreV1().ConfigMaps(cm.Namespace).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cpuBefore := cpuTime(t, p.PID())
	began := time.Now()
	var wg sync.WaitGroup
	var replaced, updates int
	wg.Go(func() {
		for ; time.Since(began) < bigReplace; replaced++ {
			data["key-000000"] = strconv.Itoa(replaced)
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: big, Name: "big"}, Data: data}
			if _, err := cs.CoreV1().ConfigMaps(big).Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
				t.Errorf("replace: %v", err)
				return
			}
			time.Sleep(time.Second)
		}
	})
	wg.Go(func() { updates = stamp(t, cs, other, "other", 200*time.Millisecond, bigReplace) })
	wg.Wait()
	checkStampLatency(t, mine, updates, "while the big configmap was replaced")
	cpu := (cpuTime(t, p.PID()) - cpuBefore).Seconds()
	t.Logf("dynwatch used %.2f CPU-s in %s: %.3f CPU-s per replacement of the 900 KB configmap (%d replacements, %d other updates)",
		cpu, time.Since(began).Round(time.Second), cpu/float64(max(1, replaced)), replaced, updates)
}
