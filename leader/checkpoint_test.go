package leader

import (
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

func TestCheckpointsRoundTripAndReadTheFormerSpelling(t *testing.T) {
	deployments := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	configmaps := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	cp := journal.Checkpoints{"audit": {deployments: 1234, configmaps: 99}}
	encoded := encodeCheckpoints(cp)
	if !strings.Contains(encoded, `"deployments.v1.apps":"1234"`) || !strings.Contains(encoded, `"configmaps.v1":"99"`) {
		t.Errorf("encoded %s; want resources named as object.ResourceName names them", encoded)
	}
	for _, tc := range []struct{ name, in string }{
		{"as this release writes them", encoded},
		{"as the release before wrote them", `{"audit":{"apps/v1/deployments":"1234","v1/configmaps":"99"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeCheckpoints(tc.in)
			if err != nil || !reflect.DeepEqual(got, cp) {
				t.Fatalf("decodeCheckpoints(%s) = %v, %v; want %v", tc.in, got, err, cp)
			}
		})
	}
}

func TestMalformedCheckpointsNameWhatIsWrong(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"not JSON", `{`, "checkpoints.json"},
		{"a resource that is not one", `{"audit":{"deployments":"1"}}`, `sink audit: resource "deployments"`},
		{"a revision that is not an integer", `{"audit":{"deployments.v1.apps":"12a"}}`, `revision "12a" is not an integer`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodeCheckpoints(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decodeCheckpoints(%s): %v; want an error containing %q", tc.in, err, tc.want)
			}
		})
	}
}

// TestCheckpointsAreActedOnOnlyWhenTheLeaseHolderWroteThemAndTheClusterReachedThem: what a
// follower makes of the checkpoint ConfigMap, below what it has seen of the resource (a revision
// past that is checked against the apiserver, in the e2e tier).
func TestCheckpointsAreActedOnOnlyWhenTheLeaseHolderWroteThemAndTheClusterReachedThem(t *testing.T) {
	configmaps := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	j, err := journal.New(journal.Options{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(), Path: filepath.Join(t.TempDir(), "state.db"),
		Targets: func() []journal.Target { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	j.ListStarted(configmaps, 1, []string{""})
	u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"namespace": "ns", "name": "a", "uid": "u", "resourceVersion": "50"}}}
	j.OnEvent(object.Event{Type: object.Added, Resource: configmaps, Object: object.New(u), Revision: 50, InOrder: true})
	if err := j.Flush(); err != nil {
		t.Fatal(err)
	}
	el, err := New(Options{Config: config.LeaderElection{Identity: "me"}, Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	lease := term{holder: "r0", transitions: 3}
	byR0 := map[string]string{holderAnnotation: "r0", transitionsAnnotation: "3"}
	for _, tc := range []struct {
		name        string
		data        string
		annotations map[string]string
		want        journal.Checkpoints
		refused     string
	}{
		{"the holder's, at what was seen", `{"sink":{"configmaps.v1":"50"}}`, byR0, journal.Checkpoints{"sink": {configmaps: 50}}, ""},
		{"the holder's, with a resource not watched here: left out", `{"sink":{"configmaps.v1":"40","secrets.v1":"90"}}`, byR0, journal.Checkpoints{"sink": {configmaps: 40}}, ""},
		{"another holder's", `{"sink":{"configmaps.v1":"40"}}`, map[string]string{holderAnnotation: "r1", transitionsAnnotation: "3"}, nil, refusedNotLeaseHolder},
		{"the holder's in an earlier term", `{"sink":{"configmaps.v1":"40"}}`, map[string]string{holderAnnotation: "r0", transitionsAnnotation: "2"}, nil, refusedNotLeaseHolder},
		{"as releases before the annotations wrote them", `{"sink":{"configmaps.v1":"40"}}`, nil, nil, refusedNotLeaseHolder},
		{"not JSON", `{"sink":`, byR0, nil, refusedMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Annotations: tc.annotations}, Data: map[string]string{checkpointKey: tc.data}}
			got, r, err := el.check(t.Context(), j, cm, lease)
			if err != nil {
				t.Fatal(err)
			}
			if tc.refused != "" {
				if r == nil || r.reason != tc.refused {
					t.Fatalf("refusal %v; want %s", r, tc.refused)
				}
				return
			}
			if r != nil || !got.Equal(tc.want) {
				t.Fatalf("check = %v, refusal %v; want %v", got, r, tc.want)
			}
		})
	}
}
