package config

import (
	"fmt"
	"reflect"
	"strings"
	"sync"

	"k8s.io/client-go/util/jsonpath"
)

// JSONPath is a parsed client-go JSONPath template that yields string values. client-go's
// evaluator keeps state between calls, so Values serialises evaluations of one JSONPath.
type JSONPath struct {
	text string
	mu   sync.Mutex
	jp   *jsonpath.JSONPath
}

// relaxed accepts kubectl's relaxed forms: "{.a.b}", ".a.b" and "a.b" are the same path.
func relaxed(text string) string {
	text = strings.TrimSpace(text)
	if strings.HasPrefix(text, "{") {
		return text
	}
	return "{." + strings.TrimPrefix(text, ".") + "}"
}

// ParseJSONPath parses a JSONPath template such as `{.spec.containers[*].image}`.
func ParseJSONPath(text string) (*JSONPath, error) {
	if strings.TrimSpace(text) == "" {
		return nil, fmt.Errorf("must not be empty")
	}
	jp := jsonpath.New("path").AllowMissingKeys(true)
	if err := jp.Parse(relaxed(text)); err != nil {
		return nil, fmt.Errorf("invalid JSONPath %q: %w", text, err)
	}
	return &JSONPath{text: text, jp: jp}, nil
}

// String returns the path as written in the configuration.
func (p *JSONPath) String() string { return p.text }

// InMetadata reports whether the path reads nothing but the object's metadata: one
// expression, starting at .metadata.
func (p *JSONPath) InMetadata() bool {
	r := relaxed(p.text)
	return strings.Count(r, "{") == 1 && (strings.HasPrefix(r, "{.metadata.") || r == "{.metadata}")
}

// Values returns the scalar values the path yields on obj, in document order. Missing keys
// yield nothing; maps and lists are skipped, since they make no useful index key.
func (p *JSONPath) Values(obj map[string]any) ([]string, error) {
	p.mu.Lock()
	results, err := p.jp.FindResults(obj)
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, set := range results {
		for _, v := range set {
			for v.Kind() == reflect.Interface && !v.IsNil() {
				v = v.Elem()
			}
			switch v.Kind() {
			case reflect.String:
				out = append(out, v.String())
			case reflect.Bool, reflect.Int, reflect.Int64, reflect.Int32, reflect.Float64, reflect.Float32:
				out = append(out, fmt.Sprint(v.Interface()))
			}
		}
	}
	return out, nil
}

// DotPath returns a simple JSONPath ("{.a.b}", ".a.b", "a.b") as the dot path a field
// selector names ("a.b"); false for one with filters, wildcards, indexes or several
// expressions.
func DotPath(text string) (string, bool) {
	p := strings.TrimSuffix(strings.TrimPrefix(relaxed(text), "{."), "}")
	if p == "" || strings.ContainsAny(p, "[]*?@()${}'\" ") || strings.HasPrefix(p, ".") || strings.HasSuffix(p, ".") || strings.Contains(p, "..") {
		return "", false
	}
	return p, true
}
