package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// TestAMetadataOnlyResourceIsServedAndDeliveredAsMetadata: with cache: metadata, the query API
// answers as the apiserver answers a client that asks for metadata only (PartialObjectMetadata,
// which a client-go metadata informer reads through dynwatch), kubectl get works, a field
// selector outside metadata is refused naming the parameter, and the webhook's events carry
// the metadata and nothing of the body.
func TestAMetadataOnlyResourceIsServedAndDeliveredAsMetadata(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	rc := newReceiver(t, nil, false)
	_, secretPath := signingSecret(t)
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	p := start(t, cluster.Kubeconfig, fmt.Sprintf(`
api: {address: "127.0.0.1:0", tls: {selfSignedCAFile: %s}}
metrics: {address: "127.0.0.1:0"}
resources:
  - {version: v1, resource: configmaps, namespaces: [%s], cache: metadata, indexers: [{name: byApp, type: label, key: app}]}
webhooks:
  - {name: meta, url: %s, signingSecretFile: %s}
`, caFile, ns, rc.URL, secretPath))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	url, _, _ := p.WaitListening(t.Context())
	d := dynwatchAPI{url: url, caFile: caFile}
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "meta", Namespace: ns, Labels: map[string]string{"app": "web"}}, Data: map[string]string{"secret-ish": "body"}}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	got := rc.waitFor(t, 1, 30*time.Second)
	if obj := got[0].payload.Object; obj["kind"] != "PartialObjectMetadata" || obj["data"] != nil || got[0].name() != "meta" {
		t.Errorf("the webhook's object: %v; want the metadata of meta, as PartialObjectMetadata", obj)
	}

	client := d.client(t, cluster.Config.BearerToken)
	testbed.Eventually(t, 20*time.Second, func() error {
		body, code := getBody(t, client, url+"/api/v1/namespaces/"+ns+"/configmaps?labelSelector=app%3Dweb")
		var list struct {
			Kind  string           `json:"kind"`
			Items []map[string]any `json:"items"`
		}
		if err := json.Unmarshal(body, &list); err != nil || code != http.StatusOK {
			return fmt.Errorf("list: %d %s", code, body)
		}
		if list.Kind != "PartialObjectMetadataList" || len(list.Items) != 1 || list.Items[0]["kind"] != "PartialObjectMetadata" || list.Items[0]["data"] != nil {
			return fmt.Errorf("list: %s; want a PartialObjectMetadataList of meta's metadata", body)
		}
		return nil
	})
	body, code := getBody(t, client, url+"/api/v1/namespaces/"+ns+"/configmaps?fieldSelector=data.x%3Dy")
	if code != http.StatusBadRequest || !strings.Contains(string(body), "fieldSelector") {
		t.Errorf("a field selector over data: %d %s; want 400 naming fieldSelector", code, body)
	}

	if out := kubectl(t, d.kubeconfig(t, cluster.Config.BearerToken), "get", "configmaps", "-n", ns); !strings.Contains(out, "meta") {
		t.Errorf("kubectl get through dynwatch:\n%s", out)
	}

	factory := metadatainformer.NewFilteredSharedInformerFactory(metadata.NewForConfigOrDie(d.restConfig(cluster.Config.BearerToken)), 0, ns, nil)
	informer := factory.ForResource(cmGVR).Informer()
	factory.Start(t.Context().Done())
	if !cache.WaitForCacheSync(t.Context().Done(), informer.HasSynced) {
		t.Fatal("a metadata informer through dynwatch did not sync")
	}
	if obj, ok, _ := informer.GetStore().GetByKey(ns + "/meta"); !ok || obj.(*metav1.PartialObjectMetadata).Labels["app"] != "web" {
		t.Errorf("the metadata informer through dynwatch holds %v (found %t); want meta with its labels", obj, ok)
	}
}
