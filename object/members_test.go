package object

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestMembersAreReadWhereverAStringsEscapesFall(t *testing.T) {
	// Strings around the length from which their end is searched for, with an escaped quote or
	// backslash at every place in them.
	for n := range 80 {
		for at := range n {
			for _, esc := range []string{`\"`, `\\`, `\u0041`} {
				raw := strings.Repeat("x", at) + esc + strings.Repeat("y", n-at)
				doc := []byte(`{"k":"` + raw + `", "n" : [1,{"a":"]"}]}`)
				ms := Members(doc, 0, nil)
				if len(ms) != 2 || !ms[0].Is(doc, "k") || !ms[1].Is(doc, "n") {
					t.Fatalf("members of %s: %v", doc, ms)
				}
				var want string
				if err := json.Unmarshal(doc[ms[0].Value:ms[0].End], &want); err != nil {
					t.Fatalf("the value of k in %s read as %s: %v", doc, doc[ms[0].Value:ms[0].End], err)
				}
				if got, end := stringValue(doc, ms[0].Value); got != want || end != ms[0].End {
					t.Fatalf("the string of %s is %q ending at %d, want %q ending at %d", doc, got, end, want, ms[0].End)
				}
				if v := string(doc[ms[1].Value:ms[1].End]); v != `[1,{"a":"]"}]` {
					t.Fatalf("the value of n in %s read as %s", doc, v)
				}
			}
		}
	}
}
