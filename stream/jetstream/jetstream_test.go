package jetstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
	"github.com/dynwatch/dynwatch/stream/streamtest"
	"github.com/dynwatch/dynwatch/test/testbed"
)

func deliveryOf(t *testing.T, gvr schema.GroupVersionResource, namespace, name string) *delivery.Delivery {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Thing", "metadata": map[string]any{"name": name}}}
	if namespace != "" {
		u.SetNamespace(namespace)
	}
	return &delivery.Delivery{Entry: journal.Entry{Event: object.Event{Resource: gvr, Object: object.New(u)}}}
}

// testCluster is the cluster the tests' events come from, with its id in every subject.
var testCluster = object.Cluster{ID: "test-cluster", InKeys: true}

func TestEveryObjectsSubjectIsSixTokensWhateverItsNameOrFiveWithoutTheCluster(t *testing.T) {
	for _, c := range []struct {
		name                             string
		gvr                              schema.GroupVersionResource
		cluster, namespace, object, want string
	}{
		{"a core namespaced object", schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, "eu-1", "default", "app-config",
			"dynwatch.eu-1.configmaps._.default.app-config"},
		{"a dotted cluster id, name and group", schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "ingresses"}, "prod.eu", "web", "www.example.com",
			"dynwatch.prod%2Eeu.ingresses.networking%2Ek8s%2Eio.web.www%2Eexample%2Ecom"},
		{"a cluster-scoped object", schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "", "system:aggregate-to-view",
			"dynwatch.1b4e28ba-2fa1-11d2-883f-0016d3cca427.clusterroles.rbac%2Eauthorization%2Ek8s%2Eio._.system%3Aaggregate-to-view"},
		{"wildcards, white space, an underscore and UTF-8", schema.GroupVersionResource{Group: "x.io", Version: "v1", Resource: "things"}, "c", "ns", "a*b>c d_é",
			"dynwatch.c.things.x%2Eio.ns.a%2Ab%3Ec%20d%5F%C3%A9"},
		{"no cluster (cluster.inKeys false): the layout of earlier releases", schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, "", "default", "app-config",
			"dynwatch.configmaps._.default.app-config"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Subject("dynwatch", c.cluster, deliveryOf(t, c.gvr, c.namespace, c.object))
			if got != c.want {
				t.Fatalf("subject %q, want %q", got, c.want)
			}
			want := 5
			if c.cluster == "" {
				want = 4
			}
			if n := strings.Count(got, "."); n != want {
				t.Fatalf("subject %q has %d dots, want %d", got, n, want)
			}
			if strings.ContainsAny(got, "*> \t") {
				t.Fatalf("subject %q holds a wildcard or white space", got)
			}
		})
	}
}

func TestAStreamCoversThePrefixOnlyWithAFilterThatHoldsEverySubjectUnderIt(t *testing.T) {
	for _, c := range []struct {
		filters []string
		prefix  string
		want    bool
	}{
		{[]string{"dynwatch.>"}, "dynwatch", true},
		{[]string{">"}, "dynwatch", true},
		{[]string{"dynwatch.*.*.*.*"}, "dynwatch", true},
		{[]string{"*.configmaps.>"}, "dynwatch", false},
		{[]string{"dynwatch.configmaps.>"}, "dynwatch", false},
		{[]string{"dynwatch.*.*.*"}, "dynwatch", false},
		{[]string{"other.>", "prod.dynwatch.>"}, "prod.dynwatch", true},
		{[]string{"prod.>"}, "prod.dynwatch", true},
		{[]string{"dynwatch"}, "dynwatch", false},
	} {
		if got := covers(c.filters, c.prefix); got != c.want {
			t.Errorf("covers(%q, %q) = %v, want %v", c.filters, c.prefix, got, c.want)
		}
	}
}

// version is a delivery of configmap default/x at resourceVersion rv.
func version(t *testing.T, uid, rv string) *delivery.Delivery {
	t.Helper()
	d := deliveryOf(t, schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, "default", "x")
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "x", "namespace": "default", "uid": uid, "resourceVersion": rv}}}
	d.Event.Object = object.New(u)
	d.Event.Type = object.Modified
	d.ID = journal.EventID(d.Event)
	return d
}

// streamS runs a nats-server until the test ends, with the stream S of the subjects dw.>, and
// returns the stream and a sink's configuration publishing to it.
func streamS(t *testing.T) (jetstream.Stream, *config.JetStream) {
	t.Helper()
	testbed.Need(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	bins, err := testbed.EnsureBinaries(ctx, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := testbed.StartNATS(ctx, bins, t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Stop)
	conn, err := nats.Connect(nc.URLs()[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	js, err := jetstream.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"dw.>"}})
	if err != nil {
		t.Fatal(err)
	}
	return stream, &config.JetStream{Sink: config.Sink{Name: "s", Timeout: 5 * time.Second}, Servers: nc.URLs(), SubjectPrefix: "dw", Stream: "S"}
}

// streamState is how many messages stream holds, and the resourceVersion of subject's last.
func streamState(t *testing.T, stream jetstream.Stream, subject string) (uint64, string) {
	t.Helper()
	info, err := stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	last, err := stream.GetLastMsgForSubject(t.Context(), subject)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs, last.Header.Get("ce-resourceversion")
}

// Two replicas' transports to one stream: what one publishes on a view of a subject the other
// has moved past is refused, so a deposed leader's late publish never lands after its
// successor's, whatever the fence did.
func TestAPublishMadeOnAStaleViewOfItsSubjectIsNotStoredAfterANewerVersion(t *testing.T) {
	ctx := t.Context()
	stream, cfg := streamS(t)
	transport := func() *Transport {
		tr := New(cfg, testCluster, slog.New(slog.DiscardHandler), delivery.Always{})
		t.Cleanup(tr.Close)
		return tr
	}
	deposed, successor := transport(), transport()
	send := func(tr *Transport, d *delivery.Delivery) error { return tr.Send(ctx, d, []byte(`{}`)) }

	if err := send(deposed, version(t, "u", "10")); err != nil {
		t.Fatal(err)
	}
	if err := send(successor, version(t, "u", "20")); err != nil {
		t.Fatal(err)
	}
	// The deposed replica still believes its own publish is the subject's last.
	if err := send(deposed, version(t, "u", "15")); !errors.Is(err, delivery.ErrSuperseded) {
		t.Fatalf("the stale publish returned %v, want delivery.ErrSuperseded", err)
	}
	// A redelivery of what the stream already ends with is done, and stores nothing.
	if err := send(transport(), version(t, "u", "20")); err != nil {
		t.Fatal(err)
	}
	if msgs, rv := streamState(t, stream, "dw.test-cluster.configmaps._.default.x"); msgs != 2 || rv != "20" {
		t.Fatalf("the stream holds %d messages ending with resourceVersion %s; want 2 ending with 20", msgs, rv)
	}
}

// An ADDED event's first publish expects an empty subject rather than reading the subject
// first: one request per new object, as an initial list or an initialState replay has; an
// object created again under its name, whose subject is not empty, is still stored after what
// the subject holds, and an ADDED event stored already is not stored twice.
func TestAnAddedEventIsPublishedInOneRequestAndStillAfterWhatItsSubjectHolds(t *testing.T) {
	ctx := t.Context()
	stream, cfg := streamS(t)
	tr := New(cfg, testCluster, slog.New(slog.DiscardHandler), delivery.Always{})
	defer tr.Close()
	added := func(name, uid, rv string) *delivery.Delivery {
		d := streamtest.ConfigMapAt("default", name, rv)
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name, "namespace": "default", "uid": uid, "resourceVersion": rv}}}
		d.Event.Object, d.Event.Type = object.New(u), object.Added
		d.ID = journal.EventID(d.Event)
		return d
	}
	send := func(d *delivery.Delivery) {
		t.Helper()
		if err := tr.Send(ctx, d, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}

	send(added("warm-up", "w", "1")) // connects, and finds the stream
	before := tr.nc.Stats().OutMsgs
	for i := range 50 {
		send(added(fmt.Sprint("new-", i), fmt.Sprint("u", i), fmt.Sprint(10+i)))
	}
	if n := tr.nc.Stats().OutMsgs - before; n > 50 {
		t.Errorf("50 ADDED events to new subjects took %d requests, want one each", n)
	}

	send(streamtest.ConfigMapAt("default", "again", "100")) // MODIFIED, of the first object of the name
	d := added("again", "second-uid", "200")
	send(d)
	other := New(cfg, testCluster, slog.New(slog.DiscardHandler), delivery.Always{}) // a successor, knowing nothing
	defer other.Close()
	if err := other.Send(ctx, d, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if msgs, rv := streamState(t, stream, "dw.test-cluster.configmaps._.default.again"); msgs != 53 || rv != "200" {
		t.Fatalf("the stream holds %d messages, the object created again ending with resourceVersion %s; want 53, ending with 200", msgs, rv)
	}
}

// A transport keeps the last sequence of the subjects of objects that exist, no more than
// knownSubjects of them: a deleted object's subject is forgotten, and its re-creation, read
// from the stream, is stored after its deletion.
func TestATransportForgetsADeletedObjectsSubjectAndStoresItsRecreation(t *testing.T) {
	stream, cfg := streamS(t)
	tr := New(cfg, testCluster, slog.New(slog.DiscardHandler), delivery.Always{})
	t.Cleanup(tr.Close)
	as := func(d *delivery.Delivery, typ object.EventType) *delivery.Delivery {
		d.Event.Type = typ
		d.ID = journal.EventID(d.Event)
		return d
	}
	for _, d := range []*delivery.Delivery{as(version(t, "u1", "10"), object.Added), as(version(t, "u1", "11"), object.Deleted)} {
		if err := tr.Send(t.Context(), d, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if n := tr.last.Len(); n != 0 {
		t.Errorf("the transport keeps %d subjects after the only object was deleted; want 0", n)
	}
	if err := tr.Send(t.Context(), as(version(t, "u2", "12"), object.Added), []byte(`{}`)); err != nil {
		t.Fatalf("the re-created object's ADDED: %v", err)
	}
	if msgs, rv := streamState(t, stream, "dw.test-cluster.configmaps._.default.x"); msgs != 3 || rv != "12" {
		t.Fatalf("the stream holds %d messages ending with resourceVersion %s; want 3 ending with 12", msgs, rv)
	}
	if n := tr.last.Len(); n != 1 {
		t.Errorf("the transport keeps %d subjects for one object; want 1", n)
	}
}
