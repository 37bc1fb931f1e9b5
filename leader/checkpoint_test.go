package leader

import (
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/journal"
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
