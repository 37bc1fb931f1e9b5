package validate

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// Selector is which objects a stream, a list or a sink selects, as a watch's path and
// selectors do: the objects of one namespace, the one object a metadata.name field selector
// names, those a label selector matches, none of the objects Except names. Each that is set must
// hold; the zero Selector selects every object. It is data rather than a function so that a record written to a file can be
// validated again (see Record).
type Selector struct {
	Namespace string `json:",omitempty"`
	Name      string `json:",omitempty"`
	// Labels is a label selector, as labels.Parse reads it, over an event's Labels.
	Labels string `json:",omitempty"`
	// Except are keys of objects never selected: for a sink, dynwatch's own leader election
	// objects, which it records and never delivers.
	Except []string `json:",omitempty"`
}

// Matches reports whether the selector selects e's object as e left it (its key and labels).
// A label selector that does not parse selects nothing.
func (s Selector) Matches(e Event) bool {
	ns, name, namespaced := strings.Cut(e.Key, "/")
	if !namespaced {
		ns, name = "", e.Key
	}
	if s.Namespace != "" && ns != s.Namespace || s.Name != "" && name != s.Name || slices.Contains(s.Except, e.Key) {
		return false
	}
	if s.Labels == "" {
		return true
	}
	sel, err := labels.Parse(s.Labels)
	if err != nil {
		return false
	}
	set, err := labels.ConvertSelectorToLabelsMap(e.Labels)
	return err == nil && sel.Matches(set)
}

// all reports whether s selects every object.
func (s Selector) all() bool {
	return s.Namespace == "" && s.Name == "" && s.Labels == "" && len(s.Except) == 0
}

// narrowed reports whether s has a label or field selector, beside a namespace.
func (s Selector) narrowed() bool { return s.Name != "" || s.Labels != "" }
