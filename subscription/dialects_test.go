package subscription

import (
	"strings"
	"testing"
)

// TestTheCloudEventsFilterDialectsSelectByTheAttributesDynwatchSets compiles each filter as a
// subscription's and evaluates it on events, as delivery does, against the attributes the
// events carry (delivery.CloudEvent).
func TestTheCloudEventsFilterDialectsSelectByTheAttributesDynwatchSets(t *testing.T) {
	cm := func(ns, name string) map[string]any {
		return map[string]any{"metadata": map[string]any{"namespace": ns, "name": name}}
	}
	core := map[string]string{"group": "", "version": "v1", "resource": "configmaps"}
	apps := map[string]string{"group": "apps", "version": "v1", "resource": "deployments"}
	type event struct {
		typ      string
		object   map[string]any
		resource map[string]string
	}
	modified := event{"MODIFIED", cm("team-a", "app-config"), core}
	added := event{"ADDED", cm("team-b", "app-config"), core}
	deploy := event{"DELETED", map[string]any{"metadata": map[string]any{"namespace": "team-a", "name": "web"}}, apps}
	node := event{"ADDED", map[string]any{"metadata": map[string]any{"name": "node-1"}}, core}
	for _, tt := range []struct {
		name    string
		filters []any
		filter  string
		want    map[*event]bool
	}{
		{"exact type", []any{map[string]any{"exact": map[string]any{"type": "io.dynwatch.resource.modified"}}}, "",
			map[*event]bool{&modified: true, &added: false, &deploy: false}},
		{"prefix subject", []any{map[string]any{"prefix": map[string]any{"subject": "team-a/"}}}, "",
			map[*event]bool{&modified: true, &added: false, &deploy: true, &node: false}},
		{"suffix subject of a cluster-scoped object", []any{map[string]any{"suffix": map[string]any{"subject": "-1"}}}, "",
			map[*event]bool{&node: true, &modified: false}},
		{"exact source", []any{map[string]any{"exact": map[string]any{"source": "/apis/apps/v1/deployments"}}}, "",
			map[*event]bool{&deploy: true, &modified: false}},
		{"any of two, and not one", []any{
			map[string]any{"any": []any{map[string]any{"exact": map[string]any{"type": "io.dynwatch.resource.added"}}, map[string]any{"exact": map[string]any{"type": "io.dynwatch.resource.deleted"}}}},
			map[string]any{"not": map[string]any{"prefix": map[string]any{"subject": "team-b/"}}},
		}, "", map[*event]bool{&deploy: true, &added: false, &modified: false, &node: true}},
		{"all, with a CEL filter beside", []any{map[string]any{"all": []any{map[string]any{"prefix": map[string]any{"subject": "team-"}}, map[string]any{"suffix": map[string]any{"subject": "config"}}}}},
			`type != "ADDED"`, map[*event]bool{&modified: true, &added: false, &deploy: false}},
		{"a value with quotes and a backslash", []any{map[string]any{"exact": map[string]any{"subject": `team-a/"x\y`}}}, "",
			map[*event]bool{&modified: false}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			spec := map[string]any{"url": "http://r/", "resources": []any{"configmaps", "deployments.apps"}, "filters": tt.filters, "subject": map[string]any{"username": "alice"}}
			if tt.filter != "" {
				spec["filter"] = tt.filter
			}
			sink, _, err := sinkOf(subscriptionOf(spec), loadConfig(t))
			if err != nil {
				t.Fatal(err)
			}
			w := sink.Shared()
			for e, want := range tt.want {
				out, _, err := w.Program.Eval(map[string]any{"type": e.typ, "object": e.object, "oldObject": nil, "resource": e.resource})
				if err != nil {
					t.Fatalf("%s %v: %v (the CEL: %s)", e.typ, e.object, err, w.Filter)
				}
				if got := out.Value() == true; got != want {
					t.Errorf("%s %v: selected %v, want %v (the CEL: %s)", e.typ, e.object, got, want, w.Filter)
				}
			}
		})
	}
}

func TestABadCloudEventsFilterIsRefusedNamingItsPath(t *testing.T) {
	for _, tt := range []struct {
		name    string
		filters []any
		want    string
	}{
		{"two dialects in one filter", []any{map[string]any{"exact": map[string]any{"type": "x"}, "prefix": map[string]any{"type": "y"}}}, "spec.filters[0]: must hold exactly one"},
		{"an attribute dynwatch does not set", []any{map[string]any{"exact": map[string]any{"datacontenttype": "x"}}}, "spec.filters[0].exact.datacontenttype: not an attribute"},
		{"sql", []any{map[string]any{"sql": "type = 'x'"}}, "spec.filters[0].sql: unknown dialect"},
		{"an empty any", []any{map[string]any{"any": []any{}}}, "spec.filters[0].any: must be a non-empty list"},
		{"a number", []any{map[string]any{"exact": map[string]any{"type": int64(3)}}}, "spec.filters[0].exact.type: must be a string"},
		{"nested too deep", []any{nest(10)}, "nested more than 8 deep"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			spec := map[string]any{"url": "http://r/", "resources": []any{"configmaps"}, "filters": tt.filters, "subject": map[string]any{"username": "alice"}}
			_, _, err := sinkOf(subscriptionOf(spec), loadConfig(t))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v, want an error saying %q", err, tt.want)
			}
		})
	}
}

// nest is a filter of n nots around an exact.
func nest(n int) map[string]any {
	f := map[string]any{"exact": map[string]any{"type": "x"}}
	for range n {
		f = map[string]any{"not": f}
	}
	return f
}
