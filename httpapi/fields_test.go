package httpapi

import "testing"

// TestAFieldSelectorsValueIsReadFromTheJSONAsTheApiserverReadsIt: a string's value, a number
// or a bool as JSON writes it, "" for anything else or nothing; each step of the path is a key
// of an object (dots within a key are the key's own), never an index into an array.
func TestAFieldSelectorsValueIsReadFromTheJSONAsTheApiserverReadsIt(t *testing.T) {
	obj := []byte(`{"metadata":{"name":"web","labels":{"app.kubernetes.io/name":"shop"}},` +
		`"spec":{"replicas":3,"paused":false,"ratio":0.5,"containers":[{"image":"nginx"}],"note":null,"template":{}}}`)
	for _, tt := range []struct {
		path []string
		want string
	}{
		{[]string{"metadata", "name"}, "web"},
		{[]string{"metadata", "labels", "app.kubernetes.io/name"}, "shop"},
		{[]string{"spec", "replicas"}, "3"},
		{[]string{"spec", "paused"}, "false"},
		{[]string{"spec", "ratio"}, "0.5"},
		{[]string{"spec", "containers", "0", "image"}, ""},
		{[]string{"spec", "containers"}, ""},
		{[]string{"spec", "note"}, ""},
		{[]string{"spec", "template"}, ""},
		{[]string{"spec", "missing"}, ""},
		{[]string{"spec", "replicas", "x"}, ""},
	} {
		if got := fieldValue(obj, jsonSteps(tt.path)); got != tt.want {
			t.Errorf("fieldValue(%q) = %q, want %q", tt.path, got, tt.want)
		}
	}
}
