package config

import (
	"fmt"
	"strings"

	"k8s.io/client-go/util/jsonpath"
)

// FieldPath locates fields to remove from an object. It is parsed from a dot path
// (`data.password`, `metadata.annotations.example\.com/secret`) or a JSONPath
// (`{.spec.containers[*].env}`), and supports field names, `*` over a map's fields, `[*]` over
// a list's items and `[n]` for one item.
type FieldPath struct {
	text  string
	steps []step
}

type stepKind int

const (
	stepField stepKind = iota
	stepAllFields
	stepAllItems
	stepItem
)

type step struct {
	kind  stepKind
	field string
	item  int
}

// String returns the path as written in the configuration.
func (p FieldPath) String() string { return p.text }

// InMetadata reports whether the path is within the object's metadata.
func (p FieldPath) InMetadata() bool {
	return len(p.steps) > 0 && p.steps[0].kind == stepField && p.steps[0].field == "metadata"
}

// ParseFieldPath parses a removeFields entry.
func ParseFieldPath(text string) (FieldPath, error) {
	if strings.TrimSpace(text) == "" {
		return FieldPath{}, fmt.Errorf("must not be empty")
	}
	parsed, err := jsonpath.Parse("removeFields", relaxed(text))
	if err != nil {
		return FieldPath{}, fmt.Errorf("invalid path %q: %w", text, err)
	}
	if len(parsed.Root.Nodes) != 1 {
		return FieldPath{}, fmt.Errorf("invalid path %q: want exactly one {...} expression", text)
	}
	list, ok := parsed.Root.Nodes[0].(*jsonpath.ListNode)
	if !ok {
		return FieldPath{}, fmt.Errorf("invalid path %q: want a {...} expression", text)
	}
	p := FieldPath{text: text}
	for _, n := range list.Nodes {
		switch n := n.(type) {
		case *jsonpath.FieldNode:
			if n.Value == "" { // the leading "." of the expression
				continue
			}
			p.steps = append(p.steps, step{kind: stepField, field: n.Value})
		case *jsonpath.WildcardNode:
			p.steps = append(p.steps, step{kind: stepAllFields})
		case *jsonpath.ArrayNode:
			s, err := arrayStep(n)
			if err != nil {
				return FieldPath{}, fmt.Errorf("invalid path %q: %w", text, err)
			}
			p.steps = append(p.steps, s)
		default:
			return FieldPath{}, fmt.Errorf("invalid path %q: %s is not supported for removal (use fields, *, [*] or [n])", text, n.Type())
		}
	}
	if len(p.steps) == 0 {
		return FieldPath{}, fmt.Errorf("invalid path %q: it selects the whole object", text)
	}
	if p.steps[len(p.steps)-1].kind == stepItem || p.steps[len(p.steps)-1].kind == stepAllItems {
		return FieldPath{}, fmt.Errorf("invalid path %q: it must end in a field name or *, not a list index", text)
	}
	return p, nil
}

func arrayStep(n *jsonpath.ArrayNode) (step, error) {
	start, end, stride := n.Params[0], n.Params[1], n.Params[2]
	switch {
	case !start.Known && !end.Known && !stride.Known:
		return step{kind: stepAllItems}, nil
	case start.Known && end.Derived && !stride.Known && start.Value >= 0:
		return step{kind: stepItem, item: start.Value}, nil
	default:
		return step{}, fmt.Errorf("only [*] and [n] list selections are supported for removal")
	}
}

// Remove deletes the fields p selects from obj, in place. Missing fields are not an error.
func (p FieldPath) Remove(obj map[string]any) {
	remove(obj, p.steps)
}

func remove(node any, steps []step) {
	s, rest := steps[0], steps[1:]
	switch s.kind {
	case stepField, stepAllFields:
		m, ok := node.(map[string]any)
		if !ok {
			return
		}
		for k, child := range m {
			if s.kind == stepField && k != s.field {
				continue
			}
			if len(rest) == 0 {
				delete(m, k)
			} else {
				remove(child, rest)
			}
		}
	case stepAllItems, stepItem:
		items, ok := node.([]any)
		if !ok {
			return
		}
		for i, child := range items {
			if s.kind == stepAllItems || i == s.item {
				remove(child, rest)
			}
		}
	}
}
