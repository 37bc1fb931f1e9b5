package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/dynwatch/dynwatch/test/testbed"
)

const numberCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: samples.cbor.example.com}
spec:
  group: cbor.example.com
  names: {plural: samples, singular: sample, kind: Sample}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

// sampleSpec has what JSON and CBOR encode differently: integers beyond 2^53, whole and
// fractional floats, negative numbers, null, booleans, text beyond ASCII, and nesting.
const sampleSpec = `{"int": 7, "big": 9007199254740993, "neg": -3, "float": 1.5, "whole": 2.0, "tiny": 1e-7,
 "yes": true, "no": false, "none": null, "text": "héllo ✓ \u0000 \"quoted\"", "list": [1, "a", {"b": false}, []], "empty": {}}`

// TestCBORFromTheApiserverGivesWhatJSONGives runs dynwatch against an apiserver that serves
// CBOR (its CBORServingAndStorage gate on), and checks that it reads CBOR where it decodes
// objects (a resource with a namespaceSelector, and the Namespaces it follows), JSON for a cache
// of whole objects (which keeps the bytes), and that what its query API answers and its webhook
// delivers of the decoded resource is what the apiserver's JSON says, number for number. Every
// other test runs against an apiserver without the gate: dynwatch asks for CBOR first there too,
// and reads the JSON it gets.
func TestCBORFromTheApiserverGivesWhatJSONGives(t *testing.T) {
	t.Parallel()
	c := ownCluster(t, testbed.Options{CBOR: true})
	dyn := dynamic.NewForConfigOrDie(c.Config)
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(numberCRD), &crd.Object); err != nil {
		t.Fatal(err)
	}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dyn.Resource(crdGVR).Create(t.Context(), crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	samples := schema.GroupVersionResource{Group: "cbor.example.com", Version: "v1", Resource: "samples"}
	sample := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cbor.example.com/v1", "kind": "Sample", "metadata": map[string]any{"name": "numbers", "namespace": "default"}}}
	var spec map[string]any
	if err := json.Unmarshal([]byte(sampleSpec), &spec); err != nil {
		t.Fatal(err)
	}
	sample.Object["spec"] = spec
	testbed.Eventually(t, 30*time.Second, func() error { // until the CRD is established
		_, err := dyn.Resource(samples).Namespace("default").Create(t.Context(), sample, metav1.CreateOptions{})
		return err
	})

	rc := newReceiver(t, nil, false)
	p := start(t, c.Kubeconfig, fmt.Sprintf(`
resources:
  - {group: cbor.example.com, version: v1, resource: samples, namespaceSelector: "kubernetes.io/metadata.name=default"}
  - {version: v1, resource: configmaps, namespaces: [default]}
webhooks: [{name: cbor, url: %s}]
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, rc.URL))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	api, metrics, _ := p.WaitListening(t.Context())
	if n := metricValue(t, metrics, `dynwatch_apiserver_responses_total{encoding="cbor"}`); n == 0 {
		t.Errorf("the apiserver sent dynwatch no CBOR")
	}
	if n := metricValue(t, metrics, `dynwatch_apiserver_responses_total{encoding="json"}`); n == 0 {
		t.Errorf("the apiserver sent dynwatch no JSON: the cache of whole configmaps reads JSON")
	}

	// The apiserver's JSON, without what dynwatch strips by default.
	body, err := kubernetes.NewForConfigOrDie(c.Config).CoreV1().RESTClient().Get().AbsPath("/apis/cbor.example.com/v1/namespaces/default/samples/numbers").SetHeader("Accept", "application/json").DoRaw(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := decodeNumbers(t, body)
	unstructured.RemoveNestedField(want, "metadata", "managedFields")

	status, got, err := get(t.Context(), api+"/apis/cbor.example.com/v1/namespaces/default/samples/numbers")
	if err != nil || status != 200 {
		t.Fatalf("GET from dynwatch: %d %v", status, err)
	}
	if diff := cmp.Diff(want, decodeNumbers(t, []byte(got))); diff != "" {
		t.Errorf("dynwatch's answer differs from the apiserver's JSON (-apiserver +dynwatch):\n%s", diff)
	}
	var delivered map[string]any
	for _, r := range rc.waitFor(t, 1, 30*time.Second) {
		if r.name() == "numbers" {
			var payload struct{ Object json.RawMessage }
			if err := json.Unmarshal(r.body, &payload); err != nil {
				t.Fatal(err)
			}
			delivered = decodeNumbers(t, payload.Object)
		}
	}
	if diff := cmp.Diff(want, delivered); diff != "" {
		t.Errorf("the webhook's object differs from the apiserver's JSON (-apiserver +webhook):\n%s", diff)
	}
}

// decodeNumbers decodes JSON keeping each number's text, so that 2 and 2.0 differ.
func decodeNumbers(t *testing.T, b []byte) map[string]any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return m
}
