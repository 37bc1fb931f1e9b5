package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// The cluster's identity in every event: see docs/identity.md.

// arrival is one event a sink holds, as the identity tests read it: the cluster its
// CloudEvents attribute names, where the sink's own addressing (a subject, a record key) puts
// it ("" where it has none), the object's key, and the version.
type arrival struct {
	cluster, addressed, key, typ string
	rv                           uint64
}

// webhookArrivals are what rc received, in order of arrival.
func webhookArrivals(rc *receiver) []arrival {
	var out []arrival
	for _, r := range rc.got() {
		meta, _ := r.payload.Object["metadata"].(map[string]any)
		rv, _ := meta["resourceVersion"].(string)
		out = append(out, arrival{cluster: r.header.Get("Ce-Cluster"), key: r.subject, typ: ceType(r.ceType), rv: object.Revision(rv)})
	}
	return out
}

// streamArrivals are s's messages in sequence order; a subject dw.<cluster>.<resource>... is
// addressed to its second token.
func streamArrivals(t *testing.T, s jetstream.Stream) []arrival {
	t.Helper()
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []arrival
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := s.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatalf("read message %d: %v", seq, err)
		}
		tokens := strings.Split(m.Subject, ".")
		out = append(out, arrival{cluster: m.Header.Get("ce-cluster"), addressed: tokens[1], key: m.Header.Get("ce-subject"),
			typ: ceType(m.Header.Get("ce-type")), rv: object.Revision(m.Header.Get("ce-resourceversion"))})
	}
	return out
}

// topicArrivals are topic's records, partition by partition in offset order; a key
// <cluster>/<ordering key> is addressed to its cluster. They also report each key's partitions.
func topicArrivals(t *testing.T, brokers []string, topic string) ([]arrival, map[string]map[int32]bool) {
	t.Helper()
	rs, err := testbed.ReadTopic(t.Context(), brokers, topic)
	if err != nil {
		t.Fatal(err)
	}
	var out []arrival
	partitions := map[string]map[int32]bool{}
	for _, r := range rs {
		a := arrival{}
		a.addressed, _, _ = strings.Cut(string(r.Key), "/")
		for _, h := range r.Headers {
			switch h.Key {
			case "ce_cluster":
				a.cluster = string(h.Value)
			case "ce_subject":
				a.key = string(h.Value)
			case "ce_type":
				a.typ = ceType(string(h.Value))
			case "ce_resourceversion":
				a.rv = object.Revision(string(h.Value))
			}
		}
		if partitions[string(r.Key)] == nil {
			partitions[string(r.Key)] = map[int32]bool{}
		}
		partitions[string(r.Key)][r.Partition] = true
		out = append(out, a)
	}
	return out, partitions
}

// versions are each cluster's arrivals object by object, in the order the sink holds them.
func versions(as []arrival) map[string]map[string][]string {
	out := map[string]map[string][]string{}
	for _, a := range as {
		if out[a.cluster] == nil {
			out[a.cluster] = map[string][]string{}
		}
		out[a.cluster][a.key] = append(out[a.cluster][a.key], fmt.Sprintf("%s@%d", a.typ, a.rv))
	}
	return out
}

// TestEverySinksEventsNameTheirClusterAndTwoClustersInOneStreamAndTopicStayApartInOrder: two
// dynwatch processes watch the same configmaps, one with no cluster configured (its id is
// the kube-system namespace's uid) and one with cluster.id west, and send to one webhook, one
// JetStream stream and one Kafka topic. Every event names its process's cluster, every subject
// and record key carries it, and each cluster's events of each object are all there, apart
// from the other's and in order: the same versions for both.
func TestEverySinksEventsNameTheirClusterAndTwoClustersInOneStreamAndTopicStayApartInOrder(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	uid := clusterID(t, cluster.Config)
	rc := newReceiver(t, nil, false)
	nats := startNATS(t, 1)
	s := createStream(t, nats.URLs(), jetstream.StreamConfig{Name: "DYNWATCH", Subjects: []string{"dw.>"}})
	k := startKafka(t)
	k.createTopic(t, "identity", 3, nil)
	sinks := fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
webhooks: [{name: r, url: %s}]
jetstream: [{name: stream, servers: [%s], subjectPrefix: dw, stream: DYNWATCH}]
kafka: [{name: topic, brokers: [%s], topic: identity}]
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns, rc.URL, strings.Join(nats.URLs(), ", "), strings.Join(k.brokers, ", "))
	byID := map[string]string{} // the query API of each cluster's dynwatch
	for _, c := range []struct{ id, config string }{
		{uid, ""},
		{"west", "cluster: {id: west, name: West Europe}\n"},
	} {
		p := start(t, cluster.Kubeconfig, sinks+c.config)
		if err := p.WaitReady(t.Context()); err != nil {
			t.Fatal(err)
		}
		byID[c.id], _, _ = p.WaitListening(t.Context())
	}

	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	const objects, updates = 8, 5
	for i := range objects {
		cm, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c-%d", i)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for u := range updates {
			cm.Data = map[string]string{"v": fmt.Sprint(u)}
			if cm, err = cs.CoreV1().ConfigMaps(ns).Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 2 {
		if err := cs.CoreV1().ConfigMaps(ns).Delete(t.Context(), fmt.Sprintf("c-%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	list, err := cs.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]string{ns + "/c-0": "DELETED", ns + "/c-1": "DELETED"}
	for _, cm := range list.Items {
		last[ns+"/"+cm.Name] = "MODIFIED@" + cm.ResourceVersion
	}
	const changes = 1 + updates // per object, and a delete for two of them
	done := func(as []arrival) error {
		v := versions(as)
		for _, id := range []string{uid, "west"} {
			for key, want := range last {
				got := v[id][key]
				if len(got) == 0 || !strings.HasPrefix(got[len(got)-1], want) {
					return fmt.Errorf("cluster %s: %s's last arrival is %v, want %s (%d arrivals, of %d objects: %v)", id, key, got, want, len(as), len(v[id]), as[:min(3, len(as))])
				}
			}
		}
		return nil
	}
	var webhook, stream, topic []arrival
	var partitions map[string]map[int32]bool
	testbed.Eventually(t, 90*time.Second, func() error {
		webhook, stream = webhookArrivals(rc), streamArrivals(t, s)
		topic, partitions = topicArrivals(t, k.brokers, "identity")
		for _, err := range []error{done(webhook), done(stream), done(topic)} {
			if err != nil {
				return err
			}
		}
		return nil
	})

	for _, sink := range []struct {
		name      string
		arrivals  []arrival
		addressed bool
	}{{"the webhook", webhook, false}, {"the stream", stream, true}, {"the topic", topic, true}} {
		for _, a := range sink.arrivals {
			if a.cluster != uid && a.cluster != "west" {
				t.Fatalf("%s: an event of %s names cluster %q, neither %s nor west", sink.name, a.key, a.cluster, uid)
			}
			if sink.addressed && a.addressed != a.cluster {
				t.Fatalf("%s: an event of %s from cluster %s is addressed to %q", sink.name, a.key, a.cluster, a.addressed)
			}
		}
		v := versions(sink.arrivals)
		for key := range last {
			east, west := v[uid][key], v["west"][key]
			if !slices.Equal(east, west) {
				t.Errorf("%s: %s's events differ between the clusters:\n%s: %v\nwest: %v", sink.name, key, uid, east, west)
			}
			want := changes
			if strings.HasPrefix(last[key], "DELETED") {
				want++
			}
			if len(east) != want {
				t.Errorf("%s: %s has %d events from %s, want %d: %v", sink.name, key, len(east), uid, want, east)
			}
		}
	}
	for key, ps := range partitions {
		if len(ps) != 1 {
			t.Errorf("the topic holds records of %s in partitions %v", key, ps)
		}
	}
	// In order: with no restart and no duplicate, the versions of each object only go up.
	for _, a := range [][]arrival{stream, topic} {
		rv := map[string]uint64{}
		for _, x := range a {
			id := x.cluster + "/" + x.key
			if x.rv <= rv[id] && x.typ != "DELETED" {
				t.Errorf("%s from %s: resourceVersion %d after %d", x.key, x.cluster, x.rv, rv[id])
			}
			rv[id] = x.rv
		}
	}
	for _, r := range rc.got() {
		if r.header.Get("Ce-Cluster") == "west" && r.header.Get("Ce-Clustername") != "West%20Europe" {
			t.Fatalf("an event of west has Ce-Clustername %q, want West%%20Europe (percent-encoded)", r.header.Get("Ce-Clustername"))
		}
	}

	// /status and the query API's answers name the cluster too.
	for id, api := range byID {
		code, body, err := get(t.Context(), api+"/status")
		if err != nil || code != http.StatusOK {
			t.Fatalf("GET /status: %d %v", code, err)
		}
		var status struct {
			Cluster object.Cluster `json:"cluster"`
		}
		if err := json.Unmarshal([]byte(body), &status); err != nil {
			t.Fatal(err)
		}
		from := object.ClusterIDFromKubeSystem
		if id == "west" {
			from = object.ClusterIDConfigured
		}
		if status.Cluster.ID != id || status.Cluster.From != from || !status.Cluster.InKeys {
			t.Errorf("/status says cluster %+v, want id %s from %s", status.Cluster, id, from)
		}
		resp, err := http.Get(api + "/api/v1/namespaces/" + ns + "/configmaps")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("Dynwatch-Cluster-Id"); got != id {
			t.Errorf("a list through the query API has Dynwatch-Cluster-Id %q, want %s", got, id)
		}
		if resp, err = http.Get(api + "/version"); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("Dynwatch-Cluster-Id"); got != "" {
			t.Errorf("/version, which anyone may read, names the cluster %q", got)
		}
	}
}

// clusterProperties is KEP-2149's ClusterProperty API.
var clusterProperties = schema.GroupVersionResource{Group: "about.k8s.io", Version: "v1alpha1", Resource: "clusterproperties"}

// installClusterProperty installs the ClusterProperty CRD on c (cluster-scoped, as SIG
// Multicluster's about-api defines it) and names the cluster id.
func installClusterProperty(t *testing.T, c *rest.Config, id string) {
	t.Helper()
	crd := &unstructured.Unstructured{}
	if err := crd.UnmarshalJSON([]byte(`{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
 "metadata":{"name":"clusterproperties.about.k8s.io","annotations":{"api-approved.kubernetes.io":"unapproved, a test's copy of the about.k8s.io API"}},
 "spec":{"group":"about.k8s.io","scope":"Cluster","names":{"kind":"ClusterProperty","plural":"clusterproperties","singular":"clusterproperty","listKind":"ClusterPropertyList"},
  "versions":[{"name":"v1alpha1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","required":["spec"],"properties":{
   "spec":{"type":"object","required":["value"],"properties":{"value":{"type":"string","maxLength":128,"minLength":1}}}}}}}]}}`)); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(c)
	if _, err := dyn.Resource(crdResource).Create(t.Context(), crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
		"metadata": map[string]any{"name": "cluster.clusterset.k8s.io"}, "spec": map[string]any{"value": id}}}
	testbed.Eventually(t, 30*time.Second, func() error { // until the CRD is established
		_, err := dyn.Resource(clusterProperties).Create(t.Context(), p, metav1.CreateOptions{})
		return err
	})
}

// A cluster of its own, since a ClusterProperty names every dynwatch on its cluster.
func TestAClusterPropertyNamesTheClusterInEveryEvent(t *testing.T) {
	t.Parallel()
	c := ownCluster(t, testbed.Options{})
	installClusterProperty(t, c.Config, "prod-eu-1")
	ns := namespaceIn(t, c.Config)
	rc := newReceiver(t, nil, false)
	p := start(t, c.Kubeconfig, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
webhooks: [{name: r, url: %s}]
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns, rc.URL))
	if err := p.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := kubernetes.NewForConfigOrDie(c.Config).CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "one"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() error {
		got := rc.got()
		if len(got) == 0 {
			return errors.New("no event yet")
		}
		if id := got[0].header.Get("Ce-Cluster"); id != "prod-eu-1" {
			return fmt.Errorf("the event names cluster %q, want prod-eu-1, the ClusterProperty's value (kube-system's uid is %s)", id, clusterID(t, c.Config))
		}
		return nil
	})
}

// A dynwatch that may read neither the ClusterProperty nor kube-system cannot name its
// cluster: it exits at start, naming the grant it needs and cluster.id.
func TestADynwatchThatMayNotReadItsClustersIDExitsNamingTheGrant(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	user := "no-cluster-id-" + ns
	grantConfigMapReads(t, nil, ns, user)
	kubeconfig, err := cluster.KubeconfigAs(user)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}}
metrics: {address: "127.0.0.1:0"}
`, ns))
	out, err := exec.CommandContext(t.Context(), dynwatchBinary(t), "--config", path, "--kubeconfig", kubeconfig).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("dynwatch that may not read kube-system: err=%v, want a non-zero exit; output:\n%s", err, out)
	}
	if want := "grant get on namespaces named kube-system, or set cluster.id"; !strings.Contains(string(out), want) {
		t.Fatalf("the output does not say %q:\n%s", want, out)
	}
}

// fieldManagers are the managers an event's payload names.
type fieldManagers []struct {
	Manager, Operation, Subresource, Time string
	Fields                                []string
}

// TestEveryEventNamesTheFieldManagerThatMadeTheChange: a server-side apply by tool-a, a patch
// by tool-b and a kubectl label each reach the webhook naming that manager and operation alone,
// in the payload's managers and in the ce-fieldmanager attribute, with managedFields stripped
// from the object as by default.
func TestEveryEventNamesTheFieldManagerThatMadeTheChange(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	rc := newReceiver(t, nil, false)
	startWithWebhooks(t, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s]}]
webhooks: [{name: r, url: %s}]`, ns, rc.URL))
	manifest := filepath.Join(t.TempDir(), "cm.yaml")
	writeFile(t, manifest, fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: tracked, namespace: %s}\ndata: {k: v}\n", ns))
	kubectl(t, "", "apply", "--server-side", "--field-manager=tool-a", "-f", manifest)
	kubectl(t, "", "patch", "configmap", "tracked", "-n", ns, "--field-manager=tool-b", "--type=merge", "-p", `{"data":{"l":"w"}}`)
	kubectl(t, "", "label", "configmap", "tracked", "-n", ns, "tier=gold")
	want := []struct{ typ, manager, operation, field string }{
		{"ADDED", "tool-a", "Apply", "data"},
		{"MODIFIED", "tool-b", "Update", "data"},
		{"MODIFIED", "kubectl-label", "Update", "metadata.labels"},
	}
	var got []received
	testbed.Eventually(t, 30*time.Second, func() error {
		if got = rc.got(); len(got) < len(want) {
			return fmt.Errorf("%d events, want %d", len(got), len(want))
		}
		return nil
	})
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d", len(got), len(want))
	}
	for i, w := range want {
		r := got[i]
		var body struct {
			Managers fieldManagers `json:"managers"`
		}
		if err := json.Unmarshal(r.body, &body); err != nil {
			t.Fatal(err)
		}
		if r.payload.Type != w.typ || len(body.Managers) != 1 || body.Managers[0].Manager != w.manager || body.Managers[0].Operation != w.operation ||
			!slices.Contains(body.Managers[0].Fields, w.field) || body.Managers[0].Time == "" {
			t.Errorf("event %d: %s naming %+v; want %s by %s (%s) owning %s", i, r.payload.Type, body.Managers, w.typ, w.manager, w.operation, w.field)
		}
		if h := r.header.Get("Ce-Fieldmanager"); h != w.manager {
			t.Errorf("event %d: ce-fieldmanager %q, want %s", i, h, w.manager)
		}
		meta, _ := r.payload.Object["metadata"].(map[string]any)
		if _, ok := meta["managedFields"]; ok || meta == nil {
			t.Errorf("event %d: the object keeps its managedFields: %v", i, meta)
		}
	}
}

// TestAListAtAResourceVersionIsAnsweredAsTheApiserverAnswersIt: resourceVersionMatch and
// resourceVersion on a list, side by side with the apiserver: the same refusal (422 Invalid)
// of options the apiserver refuses (on a watch too), the same items at the cache's own resourceVersion with
// Exact, and the same 504 for a resourceVersion not reached within 3 s. At an older
// resourceVersion with Exact the apiserver answers from etcd and dynwatch, which keeps no past
// state, 410 Expired: never the present in its place.
func TestAListAtAResourceVersionIsAnsweredAsTheApiserverAnswersIt(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	cs := kubernetes.NewForConfigOrDie(cluster.Config)
	for i := range 3 {
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c-%d", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	p, _ := startWithWebhooks(t, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s]}]`, ns))
	api, _, _ := p.WaitListening(t.Context())
	apiserver, err := rest.HTTPClientFor(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	path := "/api/v1/namespaces/" + ns + "/configmaps"
	type answer struct {
		code           int
		reason, causes string
		items          []string
		rv             string
	}
	ask := func(client *http.Client, base, query string) answer {
		t.Helper()
		resp, err := client.Get(base + path + "?" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Reason   metav1.StatusReason `json:"reason"`
			Details  *metav1.StatusDetails
			Metadata metav1.ListMeta `json:"metadata"`
			Items    []metav1.PartialObjectMetadata
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		a := answer{code: resp.StatusCode, reason: string(body.Reason), rv: body.Metadata.ResourceVersion}
		if body.Details != nil {
			for _, c := range body.Details.Causes {
				a.causes += string(c.Type) + ":" + c.Field + " "
			}
		}
		for _, it := range body.Items {
			a.items = append(a.items, it.Name+"@"+it.ResourceVersion)
		}
		return a
	}
	dynwatch := ask(http.DefaultClient, api, "")
	if dynwatch.code != http.StatusOK || len(dynwatch.items) != 3 {
		t.Fatalf("a plain list through dynwatch: %+v", dynwatch)
	}
	now := dynwatch.rv
	future := fmt.Sprint(object.Revision(now) + 1_000_000)
	for _, c := range []struct{ name, query string }{
		{"Exact without a resourceVersion", "resourceVersionMatch=Exact"},
		{"Exact at 0", "resourceVersionMatch=Exact&resourceVersion=0"},
		{"an unknown match", "resourceVersionMatch=Newest&resourceVersion=1"},
		{"sendInitialEvents on a list", "sendInitialEvents=true"},
		{"NotOlderThan a resourceVersion not reached", "resourceVersionMatch=NotOlderThan&resourceVersion=" + future},
		{"a watch with Exact", "watch=1&timeoutSeconds=1&resourceVersionMatch=Exact&resourceVersion=" + now},
		{"a watch with NotOlderThan and no sendInitialEvents", "watch=1&timeoutSeconds=1&resourceVersionMatch=NotOlderThan&resourceVersion=" + now},
		{"a watch with sendInitialEvents and no resourceVersionMatch", "watch=1&timeoutSeconds=1&sendInitialEvents=true"},
	} {
		t.Run(c.name, func(t *testing.T) {
			want, got := ask(apiserver, cluster.Config.Host, c.query), ask(http.DefaultClient, api, c.query)
			if got.code != want.code || got.reason != want.reason || got.causes != want.causes || !slices.Equal(got.items, want.items) {
				t.Fatalf("dynwatch answers %+v\nthe apiserver %+v", got, want)
			}
		})
	}
	// Exact at the resourceVersion the cache is at, read just before: a bookmark may move the
	// cache on between the two (then dynwatch, which keeps no past state here, answers 410,
	// as it should), so it is asked again at the new one.
	t.Run("Exact at the cache's resourceVersion", func(t *testing.T) {
		testbed.Eventually(t, 30*time.Second, func() error {
			at := ask(http.DefaultClient, api, "").rv
			query := "resourceVersionMatch=Exact&resourceVersion=" + at
			got, want := ask(http.DefaultClient, api, query), ask(apiserver, cluster.Config.Host, query)
			if got.code != want.code || got.reason != want.reason || got.causes != want.causes || !slices.Equal(got.items, want.items) {
				return fmt.Errorf("at %s, dynwatch answers %+v\nthe apiserver %+v", at, got, want)
			}
			return nil
		})
	})
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "later"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() error {
		if a := ask(http.DefaultClient, api, ""); len(a.items) != 4 {
			return fmt.Errorf("dynwatch lists %v", a.items)
		}
		return nil
	})
	if got := ask(http.DefaultClient, api, "resourceVersionMatch=Exact&resourceVersion="+now); got.code != http.StatusGone || got.reason != string(metav1.StatusReasonExpired) {
		t.Fatalf("a list at the older resourceVersion %s with Exact: %+v, want 410 Expired", now, got)
	}
}
