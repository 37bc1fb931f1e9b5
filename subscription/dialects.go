package subscription

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// This file maps the CloudEvents Subscriptions API's filter dialects (exact, prefix, suffix,
// all, any, not) onto a CEL expression over what a sink's filter sees, so that they select as
// dynwatch's own filters do: the attributes dynwatch sets from the event, each written as the
// CEL that computes it.

// attributes are the CloudEvents attributes a dialect may name, as CEL over a filter's
// variables: the values delivery.CloudEvent gives them.
var attributes = map[string]string{
	"type":    `{"ADDED": "io.dynwatch.resource.added", "MODIFIED": "io.dynwatch.resource.modified", "DELETED": "io.dynwatch.resource.deleted"}[type]`,
	"source":  `(resource.group == "" ? "/api/" + resource.version : "/apis/" + resource.group + "/" + resource.version) + "/" + resource.resource`,
	"subject": `((has(object.metadata.namespace) && object.metadata.namespace != "") ? object.metadata.namespace + "/" : "") + object.metadata.name`,
}

// maxFilterDepth bounds how deeply all, any and not nest.
const maxFilterDepth = 8

// dialects is the CEL of filters, all of which must match (as the API's filters array says),
// or "" for none; its errors name each filter's path under path.
func dialects(path string, filters []map[string]any) (string, error) {
	var parts []string
	var errs []error
	for i, f := range filters {
		expr, err := dialect(fmt.Sprintf("%s[%d]", path, i), f, 1)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		parts = append(parts, expr)
	}
	if len(errs) > 0 {
		return "", errors.Join(errs...)
	}
	return strings.Join(parts, " && "), nil
}

// dialect is the CEL of one filter: an object with exactly one dialect.
func dialect(path string, f map[string]any, depth int) (string, error) {
	if depth > maxFilterDepth {
		return "", fmt.Errorf("%s: nested more than %d deep", path, maxFilterDepth)
	}
	if len(f) != 1 {
		return "", fmt.Errorf("%s: must hold exactly one of exact, prefix, suffix, all, any, not", path)
	}
	for name, v := range f {
		p := path + "." + name
		switch name {
		case "exact", "prefix", "suffix":
			return match(p, name, v)
		case "all", "any":
			list, ok := v.([]any)
			if !ok || len(list) == 0 {
				return "", fmt.Errorf("%s: must be a non-empty list of filters", p)
			}
			var parts []string
			for i, item := range list {
				m, ok := item.(map[string]any)
				if !ok {
					return "", fmt.Errorf("%s[%d]: must be a filter", p, i)
				}
				expr, err := dialect(fmt.Sprintf("%s[%d]", p, i), m, depth+1)
				if err != nil {
					return "", err
				}
				parts = append(parts, expr)
			}
			op := " && "
			if name == "any" {
				op = " || "
			}
			return "(" + strings.Join(parts, op) + ")", nil
		case "not":
			m, ok := v.(map[string]any)
			if !ok {
				return "", fmt.Errorf("%s: must be a filter", p)
			}
			expr, err := dialect(p, m, depth+1)
			if err != nil {
				return "", err
			}
			return "!" + expr, nil
		default:
			return "", fmt.Errorf("%s: unknown dialect (exact, prefix, suffix, all, any, not; sql is not supported)", p)
		}
	}
	panic("unreachable")
}

// match is the CEL of an exact, prefix or suffix dialect: every attribute it names must match.
func match(path, kind string, v any) (string, error) {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		return "", fmt.Errorf("%s: must map attribute names to values", path)
	}
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(m)) {
		attr, known := attributes[name]
		if !known {
			return "", fmt.Errorf("%s.%s: not an attribute a filter can match (type, source, subject)", path, name)
		}
		value, ok := m[name].(string)
		if !ok {
			return "", fmt.Errorf("%s.%s: must be a string", path, name)
		}
		lit := strconv.Quote(value)
		switch kind {
		case "exact":
			parts = append(parts, "("+attr+") == "+lit)
		case "prefix":
			parts = append(parts, "("+attr+").startsWith("+lit+")")
		case "suffix":
			parts = append(parts, "("+attr+").endsWith("+lit+")")
		}
	}
	return "(" + strings.Join(parts, " && ") + ")", nil
}
