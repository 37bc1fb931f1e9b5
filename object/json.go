package object

import (
	"encoding/json"
	"slices"
	"strconv"
	"unsafe"
)

// appendJSON appends the JSON encoding of v, a value of unstructured content (maps, slices,
// strings, int64, bool, nil) such as a decoded object's Object, to buf, exactly as
// encoding/json would: map keys sorted, HTML characters escaped. It avoids encoding/json's
// reflection where every object coming in is encoded (see Object); anything it does not handle
// itself (floats, strings that need escaping, other types) it hands to encoding/json.
func appendJSON(buf []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(buf, "null"...)
	case string:
		return appendString(buf, v)
	case bool:
		return strconv.AppendBool(buf, v)
	case int64:
		return strconv.AppendInt(buf, v, 10)
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		buf = append(buf, '{')
		for i, k := range keys {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendString(buf, k)
			buf = append(buf, ':')
			buf = appendJSON(buf, v[k])
		}
		return append(buf, '}')
	case []any:
		buf = append(buf, '[')
		for i, item := range v {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendJSON(buf, item)
		}
		return append(buf, ']')
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return append(buf, "null"...)
		}
		return append(buf, b...)
	}
}

// AppendString appends s as a JSON string. Strings with characters encoding/json escapes
// go through it.
func AppendString(buf []byte, s string) []byte { return appendString(buf, s) }

// appendString quotes s; strings with characters encoding/json escapes go through it.
func appendString(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s)
			return append(buf, b...)
		}
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"')
}

// docOf is b as a string, without a copy, for gjson to read: b must not change while it is
// read.
func docOf(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
