package e2e

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// stamp updates configmap ns/name every interval for d, each time with the time of the update
// (Unix nanoseconds) in its data key "at", and returns how many updates it made.
func stamp(t *testing.T, cs kubernetes.Interface, ns, name string, interval, d time.Duration) int {
	updates := 0
	for began := time.Now(); time.Since(began) < d; updates++ {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{"at": strconv.FormatInt(time.Now().UnixNano(), 10)}}
		if _, err := cs.CoreV1().ConfigMaps(ns).Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
			t.Errorf("update %s/%s: %v", ns, name, err)
			break
		}
		time.Sleep(interval)
	}
	return updates
}

// checkStampLatency waits until rc has received n stamped updates (see stamp) and fails the
// test unless their p99 from update to receipt is at most 250 ms; while names the circumstance.
func checkStampLatency(t *testing.T, rc *receiver, n int, while string) {
	t.Helper()
	var latencies []time.Duration
	testbed.Eventually(t, time.Minute, func() error {
		latencies = latencies[:0]
		for _, r := range rc.got() {
			if at, err := strconv.ParseInt(r.data("at", false), 10, 64); err == nil {
				latencies = append(latencies, r.at.Sub(time.Unix(0, at)))
			}
		}
		if len(latencies) < n {
			return fmt.Errorf("%d of %d updates received", len(latencies), n)
		}
		return nil
	})
	if p := percentile(latencies, 0.99); p > 250*time.Millisecond {
		t.Errorf("the other tenant's updates %s: p99 update to receipt %s over %d; want at most 250ms", while, p, len(latencies))
	} else {
		t.Logf("the other tenant's updates %s: p99 update to receipt %s over %d", while, p, len(latencies))
	}
}
