package object

import (
	"bytes"
	"encoding/json"

	"github.com/wI2L/jsondiff"
)

// JSONPatch is the RFC 6902 JSON Patch that turns the JSON document old into cur ([] when they
// are the same). Numbers are compared as they are written, so that an integer beyond 2^53
// survives exactly.
func JSONPatch(old, cur []byte) ([]byte, error) {
	patch, err := jsondiff.CompareJSON(old, cur, jsondiff.UnmarshalFunc(UnmarshalNumbers))
	if err != nil {
		return nil, err
	}
	if len(patch) == 0 {
		return []byte(`[]`), nil
	}
	return json.Marshal(patch)
}

// UnmarshalNumbers is json.Unmarshal keeping numbers as they are written (json.Number).
func UnmarshalNumbers(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return dec.Decode(v)
}
