package webhook

import (
	"net/textproto"
	"testing"
)

// TestACloudEventsStringIsPercentEncodedInItsHeaderAsTheHTTPBindingSays: space, '"', '%' and
// every byte outside printable ASCII are percent-encoded (UTF-8 bytes); the rest is kept.
func TestACloudEventsStringIsPercentEncodedInItsHeaderAsTheHTTPBindingSays(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"ns/cm-1", "ns/cm-1"},
		{"", ""},
		{"a b", "a%20b"},
		{`say "hi"`, "say%20%22hi%22"},
		{"100%", "100%25"},
		{"café", "caf%C3%A9"},
		{"tab\there", "tab%09here"},
		{"del\x7f", "del%7F"},
	} {
		if got := ceString(tt.in); got != tt.want {
			t.Errorf("ceString(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

// TestEveryAttributeHeaderIsSpelledAsHTTPHeaderKeepsIt: the headers spelled out for the
// attributes dynwatch sends are the canonical ones, as any other is made.
func TestEveryAttributeHeaderIsSpelledAsHTTPHeaderKeepsIt(t *testing.T) {
	for _, name := range []string{"specversion", "id", "source", "type", "subject", "time", "filtererror"} {
		if got, want := ceHeader(name), textproto.CanonicalMIMEHeaderKey("ce-"+name); got != want {
			t.Errorf("ceHeader(%q) = %q; want %q", name, got, want)
		}
	}
}
