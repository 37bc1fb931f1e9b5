package delivery

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

// randomValue makes a JSON value of at most depth levels: objects, arrays, strings, numbers
// (integers beyond 2^53 among them), booleans and, if nulls, nulls.
func randomValue(r *rand.Rand, depth int, nulls bool) any {
	kinds := 5
	if depth > 0 {
		kinds = 7
	}
	switch r.IntN(kinds) {
	case 0:
		return fmt.Sprintf("s%d", r.IntN(5))
	case 1:
		return json.Number(fmt.Sprint(r.Int64N(1<<62) - 1<<61)) // often beyond 2^53
	case 2:
		return r.IntN(2) == 0
	case 3:
		return json.Number(fmt.Sprint(r.IntN(10)))
	case 4:
		if nulls {
			return nil
		}
		return "x"
	case 5:
		return randomObject(r, depth-1, nulls)
	default:
		a := make([]any, r.IntN(4))
		for i := range a {
			a[i] = randomValue(r, depth-1, nulls)
		}
		return a
	}
}

func randomObject(r *rand.Rand, depth int, nulls bool) map[string]any {
	o := map[string]any{}
	for range r.IntN(5) {
		o[fmt.Sprintf("k%d", r.IntN(6))] = randomValue(r, depth, nulls)
	}
	return o
}

// mutate returns a copy of v with a few random members added, removed or changed, at any
// depth.
func mutate(r *rand.Rand, v any, nulls bool) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			switch r.IntN(6) {
			case 0: // removed
			case 1:
				out[k] = randomValue(r, 2, nulls)
			default:
				out[k] = mutate(r, e, nulls)
			}
		}
		if r.IntN(3) == 0 {
			out[fmt.Sprintf("n%d", r.IntN(4))] = randomValue(r, 2, nulls)
		}
		return out
	case []any:
		out := []any{} // an empty array, not null
		for _, e := range x {
			if r.IntN(5) != 0 {
				out = append(out, mutate(r, e, nulls))
			}
		}
		if r.IntN(3) == 0 {
			out = append(out, randomValue(r, 1, nulls))
		}
		return out
	default:
		if r.IntN(4) == 0 {
			return randomValue(r, 1, nulls)
		}
		return v
	}
}

func recordedBody(t *testing.T, typ string, old, obj any) []byte {
	t.Helper()
	ev := map[string]any{"type": typ, "resource": map[string]string{"group": "", "version": "v1", "resource": "configmaps"}, "object": obj}
	if old != nil {
		ev["oldObject"] = old
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decode(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := object.UnmarshalNumbers(b, &v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return v
}

func TestEveryPatchTurnsOldObjectIntoObjectExactly(t *testing.T) {
	apply := map[config.Diff]func(old, patch []byte) ([]byte, error){
		config.DiffJSONPatch: func(old, patch []byte) ([]byte, error) {
			p, err := jsonpatch.DecodePatch(patch)
			if err != nil {
				return nil, err
			}
			return p.Apply(old)
		},
		config.DiffMergePatch: jsonpatch.MergePatch,
	}
	for kind, applyPatch := range apply {
		t.Run(string(kind), func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, uint64(len(kind))))
			nulls := kind == config.DiffJSONPatch // a merge patch cannot set a member to null (RFC 7386)
			for i := range 1000 {
				old := map[string]any{"metadata": map[string]any{"name": fmt.Sprintf("o-%d", i), "resourceVersion": "1"}, "data": randomObject(r, 3, nulls)}
				obj := mutate(r, old, nulls)
				body, err := shape(recordedBody(t, "MODIFIED", old, obj), config.Payload{Diff: kind, Object: config.PayloadFull})
				if err != nil {
					t.Fatal(err)
				}
				var got struct {
					Object, OldObject, Patch json.RawMessage
					PatchType                string
				}
				if err := json.Unmarshal(body, &got); err != nil {
					t.Fatal(err)
				}
				patched, err := applyPatch(got.OldObject, got.Patch)
				if err != nil {
					t.Fatalf("case %d: apply %s: %v", i, got.Patch, err)
				}
				if !reflect.DeepEqual(decode(t, patched), decode(t, got.Object)) {
					t.Fatalf("case %d: oldObject %s\npatched with %s\ngives %s\nwant %s", i, got.OldObject, got.Patch, patched, got.Object)
				}
				if want := map[config.Diff]string{config.DiffJSONPatch: jsonPatchType, config.DiffMergePatch: mergePatchType}[kind]; got.PatchType != want {
					t.Fatalf("patchType %q, want %q", got.PatchType, want)
				}
			}
		})
	}
}

func TestShapeLeavesWhatItNeedNotTouch(t *testing.T) {
	old := map[string]any{"data": map[string]any{"a": "1"}}
	obj := map[string]any{"data": map[string]any{"a": "2"}}
	modified, added := recordedBody(t, "MODIFIED", old, obj), recordedBody(t, "ADDED", nil, obj)
	tests := []struct {
		name    string
		body    []byte
		payload config.Payload
		want    string // the keys of the body sent, or "same" for the recorded body itself
	}{
		{"no diff asked", modified, config.Payload{Diff: config.DiffNone, Object: config.PayloadFull}, "same"},
		{"an ADDED event", added, config.Payload{Diff: config.DiffJSONPatch, Object: config.PayloadNone}, "same"},
		{"a diff beside the objects", modified, config.Payload{Diff: config.DiffJSONPatch, Object: config.PayloadFull}, "object oldObject oldResourceVersion patch patchType resource type"},
		{"the diff alone", modified, config.Payload{Diff: config.DiffMergePatch, Object: config.PayloadNone}, "oldResourceVersion patch patchType resource type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := shape(tt.body, tt.payload)
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == "same" {
				if !bytes.Equal(got, tt.body) {
					t.Errorf("body %s, want the recorded %s", got, tt.body)
				}
				return
			}
			var ev map[string]json.RawMessage
			if err := json.Unmarshal(got, &ev); err != nil {
				t.Fatal(err)
			}
			var keys string
			for _, k := range []string{"object", "oldObject", "oldResourceVersion", "patch", "patchType", "resource", "type"} {
				if ev[k] != nil {
					keys += " " + k
				}
			}
			if keys[1:] != tt.want {
				t.Errorf("body %s has%s; want %s", got, keys, tt.want)
			}
		})
	}
	if _, err := shape([]byte(`{"type":"MODIFIED",`), config.Payload{Diff: config.DiffJSONPatch, Object: config.PayloadFull}); err == nil {
		t.Error("a damaged body shaped without error")
	}
}
