package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// What the tests of the JetStream and Kafka sinks share: a small and a large object, one of
// which a destination limited to 4 KB must refuse, and dead letters to wait for.

// createSmallAndLarge creates the configmaps small, with 100 bytes of data, and large, with
// 8,000, in ns.
func createSmallAndLarge(t *testing.T, ns string) {
	t.Helper()
	cs, _ := configMaps(ns)
	for name, size := range map[string]int{"small": 100, "large": 8000} {
		_, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name},
			Data: map[string]string{"v": strings.Repeat("x", size)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// waitDeadLetters waits until the dead-letter file at path holds every one of want, and
// returns what it holds then.
func waitDeadLetters(t *testing.T, path string, timeout time.Duration, want ...string) string {
	t.Helper()
	var dead string
	testbed.Eventually(t, timeout, func() error {
		b, _ := os.ReadFile(path)
		dead = string(b)
		for _, w := range want {
			if !strings.Contains(dead, w) {
				return fmt.Errorf("%s does not hold %s yet: %q", path, w, dead)
			}
		}
		return nil
	})
	return dead
}

// onlyLargeDeadLettered waits until the dead letters at path reject the large object, and
// fails the test if they hold the small one.
func onlyLargeDeadLettered(t *testing.T, path string) {
	t.Helper()
	if dead := waitDeadLetters(t, path, 30*time.Second, `"reason":"rejected"`, `"name":"large"`); strings.Contains(dead, `"name":"small"`) {
		t.Errorf("the small object was dead-lettered too: %q", dead)
	}
}
