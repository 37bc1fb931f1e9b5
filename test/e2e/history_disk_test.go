package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// TestAFullDiskCostsTheHistoryOnlyWhatItSaysItLost runs dynwatch with a history, and its state
// store, on a filesystem the test fills: 20 configmaps created and changed once, then changed
// twice with the disk full, then twice more with its space back. The history must count the
// changes it could not write and move its floor past them (it cannot tell a list at a revision
// among them), and nothing else: at every write's resourceVersion from the floor on, a paged
// `Exact` list is the apiserver's, item for item; before it, 410 Expired; each configmap's
// revisions hold its versions from before the disk filled and from after, newest first; a
// watch from the floor gets every later change in order. After a restart on the same state,
// the floor and the answers are the same.
func TestAFullDiskCostsTheHistoryOnlyWhatItSaysItLost(t *testing.T) {
	t.Parallel()
	faults := mountFaultFS(t)
	ns := namespace(t)
	configPath := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, configPath, fmt.Sprintf(`resources: [{version: v1, resource: configmaps, namespaces: [%s], history: {retain: 1h}}]
state: {path: %s}
api: {address: "127.0.0.1:0", auth: {mode: none}, tls: {enabled: false}, watchHistory: 10}
metrics: {address: "127.0.0.1:0"}`, ns, filepath.Join(faults.Dir, "state")))
	p := startProcess(t, configPath)
	api, _, _ := p.WaitListening(t.Context())
	cms := kubernetes.NewForConfigOrDie(cluster.Config).CoreV1().ConfigMaps(ns)

	const objects = 20
	type write struct {
		name string
		rv   uint64
	}
	var writes []write
	round := func(r int) {
		t.Helper()
		for i := range objects {
			name := fmt.Sprintf("d-%02d", i)
			var cm *corev1.ConfigMap
			var err error
			if r == 0 {
				cm, err = cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"round": "0"}}, metav1.CreateOptions{})
			} else if cm, err = cms.Get(t.Context(), name, metav1.GetOptions{}); err == nil {
				cm.Data = map[string]string{"round": strconv.Itoa(r)}
				cm, err = cms.Update(t.Context(), cm, metav1.UpdateOptions{})
			}
			if err != nil {
				t.Fatal(err)
			}
			rv, _ := strconv.ParseUint(cm.ResourceVersion, 10, 64)
			writes = append(writes, write{name, rv})
		}
	}
	var st struct {
		History []struct {
			Floor uint64 `json:"floor,string"`
			Lost  uint64 `json:"lost"`
		} `json:"history"`
	}
	status := func() {
		t.Helper()
		st.History = nil
		getJSON(t, http.DefaultClient, api+"/status", &st)
		if len(st.History) != 1 {
			t.Fatalf("/status holds %d histories; want 1", len(st.History))
		}
	}
	// cached waits until dynwatch's cache holds the last write: a list reads the history once
	// it holds every change the cache does.
	cached := func(api string) {
		t.Helper()
		testbed.Eventually(t, time.Minute, func() error {
			var l struct {
				Metadata metav1.ListMeta `json:"metadata"`
			}
			getJSON(t, http.DefaultClient, api+"/api/v1/namespaces/"+ns+"/configmaps?limit=1", &l)
			if rv, _ := strconv.ParseUint(l.Metadata.ResourceVersion, 10, 64); rv < writes[len(writes)-1].rv {
				return fmt.Errorf("dynwatch's cache is at %d; the last write at %d", rv, writes[len(writes)-1].rv)
			}
			return nil
		})
	}

	round(0)
	round(1)
	cached(api)
	// The history writes within a moment of the cache: it holds the last write before the disk
	// fills.
	last := writes[len(writes)-1]
	testbed.Eventually(t, time.Minute, func() error {
		var revs revisionList
		getJSON(t, http.DefaultClient, api+"/api/v1/namespaces/"+ns+"/configmaps/"+last.name+"/revisions", &revs)
		if len(revs.Items) == 0 || revs.Items[0].ResourceVersion != strconv.FormatUint(last.rv, 10) {
			return fmt.Errorf("%s's revisions do not begin with %d yet", last.name, last.rv)
		}
		return nil
	})
	status()
	if st.History[0].Lost != 0 {
		t.Fatalf("the history lost %d changes before the disk filled", st.History[0].Lost)
	}
	beforeFull := len(writes)
	faults.Fill(true)
	round(2)
	round(3)
	// The history tries each change with the disk full, fails, and says so: its floor passes
	// each one it could not write.
	lastFull := writes[len(writes)-1].rv
	testbed.Eventually(t, time.Minute, func() error {
		if status(); st.History[0].Floor < lastFull {
			return fmt.Errorf("with the disk full, the history's floor is %d and it lost %d changes; the last change made is %d", st.History[0].Floor, st.History[0].Lost, lastFull)
		}
		return nil
	})
	afterFull := len(writes)
	faults.Fill(false)
	round(4)
	round(5)
	cached(api)
	status()
	floor, lost := st.History[0].Floor, st.History[0].Lost
	if n := uint64(afterFull - beforeFull); lost != n || floor < lastFull || floor >= writes[afterFull].rv {
		t.Fatalf("the history lost %d changes and its floor is %d; want the %d made with the disk full (%d to %d) lost, and the floor past them, before the first after (%d)",
			lost, floor, n, writes[beforeFull].rv, lastFull, writes[afterFull].rv)
	}

	apiserver, err := rest.HTTPClientFor(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	// paged is the list at rv, in pages of 7, as name@resourceVersion; or a page's code, and
	// its body.
	paged := func(client *http.Client, base string, rv uint64) ([]string, int) {
		t.Helper()
		var all []string
		query := fmt.Sprintf("resourceVersionMatch=Exact&limit=7&resourceVersion=%d", rv)
		for {
			body, code := getBody(t, client, base+"/api/v1/namespaces/"+ns+"/configmaps?"+query)
			if code != http.StatusOK {
				return []string{string(body)}, code
			}
			var l struct {
				Metadata metav1.ListMeta `json:"metadata"`
				Items    []metav1.PartialObjectMetadata
			}
			if err := json.Unmarshal(body, &l); err != nil {
				t.Fatal(err)
			}
			for _, it := range l.Items {
				all = append(all, it.Name+"@"+it.ResourceVersion)
			}
			if l.Metadata.Continue == "" {
				return all, code
			}
			query = "limit=7&continue=" + l.Metadata.Continue
		}
	}
	answers := func(api string) {
		t.Helper()
		for i := 0; i < len(writes); i += 3 {
			rv := writes[i].rv
			got, code := paged(http.DefaultClient, api, rv)
			if rv < floor {
				if code != http.StatusGone {
					t.Fatalf("a list at %d, before the floor %d: %d %v; want 410 Expired", rv, floor, code, got)
				}
				continue
			}
			want, wantCode := paged(apiserver, cluster.Config.Host, rv)
			if wantCode != http.StatusOK || code != http.StatusOK || !reflect.DeepEqual(got, want) {
				t.Fatalf("the list at %d (the floor %d):\ndynwatch      %d %v\nthe apiserver %d %v", rv, floor, code, got, wantCode, want)
			}
		}
		// Each configmap's revisions: its versions from before the disk filled and after it
		// came back, newest first; those the disk refused are not claimed.
		for i := range objects {
			name := fmt.Sprintf("d-%02d", i)
			var want []string
			for j := len(writes) - 1; j >= 0; j-- {
				if w := writes[j]; w.name == name && (j < beforeFull || j >= afterFull) {
					want = append(want, strconv.FormatUint(w.rv, 10))
				}
			}
			var revs revisionList
			getJSON(t, http.DefaultClient, api+"/api/v1/namespaces/"+ns+"/configmaps/"+name+"/revisions", &revs)
			var got []string
			for _, it := range revs.Items {
				if rv, _ := strconv.ParseUint(it.ResourceVersion, 10, 64); rv >= writes[beforeFull].rv && rv < writes[afterFull].rv {
					t.Fatalf("%s's revisions claim %d, a version the disk refused", name, rv)
				}
				got = append(got, it.ResourceVersion)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s's revisions: %v; want %v", name, got, want)
			}
		}
		// A watch from the floor: every later change, in order (more than watchHistory back).
		resp, err := http.Get(fmt.Sprintf("%s/api/v1/namespaces/%s/configmaps?watch=true&timeoutSeconds=30&resourceVersion=%d", api, ns, floor))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		dec := json.NewDecoder(resp.Body)
		for _, w := range writes {
			if w.rv <= floor {
				continue
			}
			var ev struct {
				Type   string
				Object metav1.PartialObjectMetadata
			}
			if err := dec.Decode(&ev); err != nil {
				t.Fatalf("the watch from %d, before %s@%d: %v", floor, w.name, w.rv, err)
			}
			if got := fmt.Sprintf("%s %s@%s", ev.Type, ev.Object.Name, ev.Object.ResourceVersion); got != fmt.Sprintf("MODIFIED %s@%d", w.name, w.rv) {
				t.Fatalf("the watch from %d sent %s; want MODIFIED %s@%d", floor, got, w.name, w.rv)
			}
		}
	}
	answers(api)

	if err := p.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	p = startProcess(t, configPath)
	api, _, _ = p.WaitListening(t.Context())
	cached(api)
	answers(api) // at once: the history is read before any change of the resource since the start
	status()
	if st.History[0].Floor != floor {
		t.Fatalf("after a restart the floor is %d; want %d, where the full disk left it", st.History[0].Floor, floor)
	}
}
