package testbed

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// createWorkers is how many creates CreateConfigMaps has in flight: enough to keep a test bed
// apiserver busy on two cores.
const createWorkers = 16

// CreateConfigMaps creates configMap(0) … configMap(n-1) through the apiserver of cfg, several
// at a time and without a client-side rate limit, and returns the first error. Their namespaces
// must exist. The order in which they are created is not defined.
func CreateConfigMaps(ctx context.Context, cfg *rest.Config, n int, configMap func(i int) *corev1.ConfigMap) error {
	unlimited := rest.CopyConfig(cfg)
	unlimited.QPS, unlimited.Burst = -1, 0
	// Protobuf costs the apiserver, and a client built with the race detector, less than JSON.
	unlimited.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(unlimited)
	if err != nil {
		return err
	}
	g, creating := errgroup.WithContext(ctx)
	g.SetLimit(createWorkers)
	for i := 0; i < n && creating.Err() == nil; i++ {
		cm := configMap(i)
		g.Go(func() error {
			if _, err := cs.CoreV1().ConfigMaps(cm.Namespace).Create(creating, cm, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create configmap %s/%s: %w", cm.Namespace, cm.Name, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err() // ended before all were created
}

// NumberedConfigMap builds, for CreateConfigMaps, configmaps in namespace ns named by format
// with their index (cm-%05d: cm-00000, cm-00001, …) and holding data v=1.
func NumberedConfigMap(ns, format string) func(i int) *corev1.ConfigMap {
	return func(i int) *corev1.ConfigMap {
		return &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf(format, i)},
			Data:       map[string]string{"v": "1"},
		}
	}
}
