package dynamicinformer

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynwatch/dynwatch/test/testbed"
)

var checkObjects = flag.Int("check-objects", 100_000, "configmaps in BenchmarkConsistencyCheck's cache")

// BenchmarkConsistencyCheck is what one consistency check of a cache of -check-objects
// configmaps (about 1 KB each, as the apiserver serves them) costs: besides the time (ns/op) and
// what it allocates, the CPU it takes in this process (dynwatch's part: the digest of the cache
// and of the list's pages) and in the apiserver (the list at the cache's resourceVersion, 500
// objects a page, metadata only; and for comparison 5,000 a page, and one list), per check.
// Loading the objects takes minutes.
func BenchmarkConsistencyCheck(b *testing.B) {
	if cluster == nil {
		b.Skip("needs the test bed")
	}
	ns := namespaces(b, 1)[0]
	start := time.Now()
	err := testbed.CreateConfigMaps(b.Context(), cluster.Config, *checkObjects, func(i int) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("cm-%06d", i), Labels: map[string]string{"app": fmt.Sprint(i % 1000)}},
			Data: map[string]string{"payload": strings.Repeat("x", 800)}}
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("loaded %d configmaps in %s", *checkObjects, time.Since(start).Round(time.Second))
	m := startManager(b, cluster.Config, fmt.Sprintf("resources: [{version: v1, resource: configmaps, namespaces: [%s]}]\nconsistencyCheck: {enabled: false}\n", ns))
	r := resource(b, m, "configmaps.v1")
	testbed.Eventually(b, 10*time.Minute, func() error {
		if n := r.Status().Objects; n != int64(*checkObjects) || !r.Status().Synced {
			return fmt.Errorf("%d objects cached", n)
		}
		return nil
	})
	gvr, _, _ := r.API()
	r.mu.RLock()
	st, informers := r.store, r.informers
	r.mu.RUnlock()
	apiserver, _ := cluster.PIDs()
	ctx := context.Background()
	for _, page := range []int64{500, checkPageSize, 0} {
		name := fmt.Sprintf("pages-of-%d", page)
		if page == 0 {
			name = "one-list"
		}
		b.Run(name, func(b *testing.B) {
			m.checkPage = page
			selfBefore, apiBefore := ownCPU(b), procCPU(b, apiserver)
			b.ReportAllocs()
			for b.Loop() {
				r.checkRound(ctx, gvr, st, informers)
				if c := r.Status().Consistency; c.Result != CheckSuccess || c.Objects != *checkObjects {
					b.Fatalf("check: %+v", c)
				}
			}
			b.ReportMetric(float64((ownCPU(b)-selfBefore).Milliseconds())/float64(b.N), "dynwatch-cpu-ms/op")
			b.ReportMetric(float64((procCPU(b, apiserver)-apiBefore).Milliseconds())/float64(b.N), "apiserver-cpu-ms/op")
		})
	}
}

// ownCPU is the user and system CPU this process has used.
func ownCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is the user and system CPU process pid has used.
func procCPU(b *testing.B, pid int) time.Duration {
	d, err := testbed.CPUTime(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}
