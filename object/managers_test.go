package object

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
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
		{"times not in the apiserver's form: as they were", nil, withManagers(entry("tool-c", "Update", "2026-11-28T11:00:00+01:00", `{}`), entry("tool-d", "Update", "2026-11-28T10:00:00.5Z", `{}`), entry("tool-e", "Update", "", `{}`), entry("tool-f", "Update", "2026-02-30T10:00:00Z", `{}`), entry("tool-g", "Update", "2026-11-28T24:00:00Z", `{}`), entry("tool-h", "Update", "2026-11-28t10:00:00Z", `{}`)),
			`[{"manager":"tool-c","operation":"Update","time":"2026-11-28T11:00:00+01:00","fields":[]},{"manager":"tool-d","operation":"Update","time":"2026-11-28T10:00:00.5Z","fields":[]},{"manager":"tool-e","operation":"Update","time":"","fields":[]},{"manager":"tool-f","operation":"Update","time":"2026-02-30T10:00:00Z","fields":[]},{"manager":"tool-g","operation":"Update","time":"2026-11-28T24:00:00Z","fields":[]},{"manager":"tool-h","operation":"Update","time":"2026-11-28t10:00:00Z","fields":[]}]`},
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
			t.Errorf("ManagersOf(%s) = %v, want nil", in, got)
		}
	}
}

func TestASummaryKeepsOnceWhatItsObjectsShare(t *testing.T) {
	// 10,000 objects applied by the same two managers, owning the same fields, each at a second
	// of its own: what tells the entries apart is their times.
	const n = 10000
	sums := make([]any, n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range sums {
		at := time.Unix(1_800_000_000+int64(i), 0).UTC().Format(time.RFC3339)
		sums[i] = ManagersOf([]byte("[" + entry("tool-a", "Apply", at, `{"f:data":{"f:k":{}},"f:metadata":{"f:labels":{"f:app":{}}}}`) + "," + entry("tool-b", "Update", at, `{"f:data":{"f:k":{}}}`) + "]"))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	// Two entries' hashes and times, and a reference each to the description they share.
	if per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n; per > 128 {
		t.Errorf("a summary of two entries holds %d bytes of heap, want at most 128", per)
	}
	runtime.KeepAlive(sums)
}

func TestASummaryIsReadFromEntriesWrittenAnyValidWay(t *testing.T) {
	// White space between every token, escapes in strings and keys, members in another order,
	// a member summaries do not read, and fieldsV1's keys of list items (k:{...}) with quotes.
	in := "[ \n" + `{ "fieldsV1" : { "f:spec" : { "f:containers" : { "k:{\"name\":\"web\"}" : { ".": {} } } }, "f:metadata" : { "f:labels" : { "f:app" : { } }, "f:annotations": {} } },` +
		` "time" : "` + t1 + `", "extra": [1, {"a": "]"}], "operation" : "Update", "manager" : "tool\u002da\"x\"" , "fieldsType": "FieldsV1" } ,` + "\t" +
		` {"manager":"ctrl","operation":"Update","subresource":"status","time":"` + t0 + `","fieldsV1":{"f:status":{}}}` + " \n]"
	got := changedString(nil, OfJSON([]byte(`{}`), nil, ManagersOf([]byte(in))))
	want := `[{"manager":"tool-a\"x\"","operation":"Update","time":"` + t1 + `","fields":["metadata.annotations","metadata.labels","spec"]},` +
		`{"manager":"ctrl","operation":"Update","subresource":"status","time":"` + t0 + `","fields":["status"]}]`
	if got != want {
		t.Fatalf("summary\n%s\nwant\n%s", got, want)
	}
}

func TestASummaryOfWhatIsNotValidJSONIsMadeWithoutAPanicOrAHang(t *testing.T) {
	for n := range len(benchManagedFields) {
		ManagersOf(slices.Clip(benchManagedFields[:n])) // cut short anywhere, with no room after it
	}
	for _, in := range []string{`[}`, `[]]`, `[{]`, `[,,]`, `[{"manager":}]`, `[{"manager" "a"}]`, `[{"fieldsV1":{"f:metadata":}}]`, `[{"fieldsV1":{"f:metadata":{"f:labels"}}}]`, `[{"a":1}}]`, `["\`} {
		ManagersOf([]byte(in))
	}
}

// FuzzManagersOf looks for managedFields that make a summary panic or hang.
func FuzzManagersOf(f *testing.F) {
	f.Add(benchManagedFields)
	f.Add([]byte(`[{"manager":"a\"b","fieldsV1":{"f:metadata":{"f:labels":{}},"k:{\"x\":1}":{}}}]`))
	f.Fuzz(func(t *testing.T, managedFields []byte) {
		ManagersOf(slices.Clip(managedFields))
	})
}
