package object

import (
	"fmt"
	"strings"
	"testing"
)

// entry is one managedFields entry as the apiserver writes it.
func entry(manager, operation, time, fieldsV1 string) string {
	return fmt.Sprintf(`{"manager":%q,"operation":%q,"apiVersion":"v1","time":%q,"fieldsType":"FieldsV1","fieldsV1":%s}`, manager, operation, time, fieldsV1)
}

// withManagers is an object whose managedFields are entries.
func withManagers(entries ...string) *Object {
	return OfJSON([]byte(`{"metadata":{"name":"a"}}`), nil, ManagersOf([]byte("["+strings.Join(entries, ",")+"]")))
}

const (
	t0 = "2026-11-28T10:00:00Z"
	t1 = "2026-11-28T10:00:01Z"
)

var (
	applyA    = entry("tool-a", "Apply", t0, `{"f:data":{"f:k":{}},"f:metadata":{"f:labels":{"f:app":{}}}}`)
	applyA2   = entry("tool-a", "Apply", t0, `{"f:data":{}}`) // tool-a lost data.k to tool-b, in the same second
	patchB    = entry("tool-b", "Update", t0, `{"f:data":{"f:k":{}}}`)
	patchBAt1 = entry("tool-b", "Update", t1, `{"f:data":{"f:k":{}}}`)
	patchB2   = entry("tool-b", "Update", t0, `{"f:data":{"f:k":{},"f:l":{}}}`)
	label     = entry("kubectl-label", "Update", t1, `{"f:metadata":{"f:labels":{"f:tier":{}}}}`)
	status    = `{"manager":"ctrl","operation":"Update","subresource":"status","apiVersion":"v1","time":"` + t1 + `","fieldsType":"FieldsV1","fieldsV1":{"f:status":{}}}`
)

func TestTheManagersOfAChangeAreTheEntriesThatChangedAtIt(t *testing.T) {
	a := `{"manager":"tool-a","operation":"Apply","time":"` + t0 + `","fields":["data","metadata.labels"]}`
	for _, c := range []struct {
		name     string
		old, cur *Object
		want     string
	}{
		{"an object new to the cache: every entry", nil, withManagers(applyA, status),
			`[` + a + `,{"manager":"ctrl","operation":"Update","subresource":"status","time":"` + t1 + `","fields":["status"]}]`},
		{"a new manager's entry", withManagers(applyA), withManagers(applyA2, patchB),
			`[{"manager":"tool-b","operation":"Update","time":"` + t0 + `","fields":["data"]}]`},
		{"an entry whose time moved", withManagers(applyA, patchB), withManagers(applyA, patchBAt1),
			`[{"manager":"tool-b","operation":"Update","time":"` + t1 + `","fields":["data"]}]`},
		{"a label by kubectl", withManagers(applyA, patchB), withManagers(applyA, patchB, label),
			`[{"manager":"kubectl-label","operation":"Update","time":"` + t1 + `","fields":["metadata.labels"]}]`},
		{"no stamp moved: the entries whose fields changed, within the same second", withManagers(applyA, patchB), withManagers(applyA, patchB2),
			`[{"manager":"tool-b","operation":"Update","time":"` + t0 + `","fields":["data"]}]`},
		{"nothing changed in managedFields: nobody", withManagers(applyA), withManagers(applyA), `[]`},
		{"an old object with no summary (resumed from the state store): the latest entries", OfJSON([]byte(`{}`), nil, nil), withManagers(applyA, label),
			`[{"manager":"kubectl-label","operation":"Update","time":"` + t1 + `","fields":["metadata.labels"]}]`},
		{"no managedFields: not known", withManagers(applyA), OfJSON([]byte(`{}`), nil, nil), ``},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := string(ChangedManagers(c.old, c.cur)); got != c.want {
				t.Fatalf("changed managers\n%s\nwant\n%s", got, c.want)
			}
		})
	}
}

func TestThePrimaryManagerIsTheLatestNamedFirst(t *testing.T) {
	for changed, want := range map[string]string{
		changedString(nil, withManagers(applyA, patchB, label)): "kubectl-label",
		changedString(nil, withManagers(applyA, patchB)):        "tool-a",
		`[]`: "",
		``:   "",
	} {
		if got := PrimaryManager([]byte(changed)); got != want {
			t.Errorf("the primary manager of %s is %q, want %q", changed, got, want)
		}
	}
}

// changedString is ChangedManagers as a string.
func changedString(old, cur *Object) string { return string(ChangedManagers(old, cur)) }

func TestASummaryIsNotMadeOfWhatIsNotAnArrayOfEntries(t *testing.T) {
	for _, in := range []string{``, `null`, `{}`, `[]`, `[1,"x"]`} {
		if got := ManagersOf([]byte(in)); got != nil {
			t.Errorf("ManagersOf(%s) = %q, want nil", in, got)
		}
	}
}
