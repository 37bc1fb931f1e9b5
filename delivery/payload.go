package delivery

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/object"
)

// The media types of the patches a MODIFIED event may carry, in its patchType.
const (
	jsonPatchType  = "application/json-patch+json"
	mergePatchType = "application/merge-patch+json"
)

// shape returns the request body a sink with payload p sends for an event whose recorded body
// (journal.AppendBody) is body. It is body itself unless p asks for a diff and the event is
// MODIFIED: then the body gains "patch", the change from oldObject to object as p.Diff says,
// "patchType", its media type, and "oldResourceVersion", the resourceVersion the patch applies
// to (a receiver holding another has missed an event); with p.Object none it loses object and
// oldObject. The outbox and dead letters keep the recorded body, whole.
func shape(body []byte, p config.Payload) ([]byte, error) {
	if p.Diff == config.DiffNone {
		return body, nil
	}
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(body, &ev); err != nil {
		return nil, fmt.Errorf("decode the event: %w", err)
	}
	if !bytes.Equal(ev["type"], []byte(`"MODIFIED"`)) || ev["oldObject"] == nil {
		return body, nil
	}
	patch, mediaType, err := diff(p.Diff, ev["oldObject"], ev["object"])
	if err != nil {
		return nil, fmt.Errorf("diff oldObject and object: %w", err)
	}
	var old struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(ev["oldObject"], &old); err != nil {
		return nil, fmt.Errorf("decode oldObject: %w", err)
	}
	base, _ := json.Marshal(old.Metadata.ResourceVersion) // a string always encodes
	ev["patch"], ev["patchType"], ev["oldResourceVersion"] = patch, json.RawMessage(`"`+mediaType+`"`), base
	if p.Object == config.PayloadNone {
		delete(ev, "object")
		delete(ev, "oldObject")
	}
	return json.Marshal(ev) // keys in order: the same event always makes the same body
}

// diff returns the patch from old to cur as kind says, and its media type.
func diff(kind config.Diff, old, cur []byte) (json.RawMessage, string, error) {
	switch kind {
	case config.DiffJSONPatch:
		b, err := object.JSONPatch(old, cur)
		return b, jsonPatchType, err
	case config.DiffMergePatch:
		var o, n any
		if err := object.UnmarshalNumbers(old, &o); err != nil {
			return nil, "", err
		}
		if err := object.UnmarshalNumbers(cur, &n); err != nil {
			return nil, "", err
		}
		b, err := json.Marshal(mergePatch(o, n))
		return b, mergePatchType, err
	}
	return nil, "", fmt.Errorf("unknown diff %q", kind)
}

// mergePatch is the RFC 7386 merge patch that turns old into cur: cur itself unless both are
// objects; else an object with each member removed from old as null, and each member added or
// changed as its merge patch. (jsondiff's and json-patch's generators decode numbers as
// float64, which rounds integers beyond 2^53; this one keeps json.Number.) A member whose new
// value is null cannot be told from a removal: RFC 7386 has no way to set null.
func mergePatch(old, cur any) any {
	o, ok := old.(map[string]any)
	n, ok2 := cur.(map[string]any)
	if !ok || !ok2 {
		return cur
	}
	patch := map[string]any{}
	for k := range o {
		if _, kept := n[k]; !kept {
			patch[k] = nil
		}
	}
	for k, nv := range n {
		if ov, had := o[k]; !had || !reflect.DeepEqual(ov, nv) {
			patch[k] = mergePatch(ov, nv)
		}
	}
	return patch
}
