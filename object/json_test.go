package object

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// unstructuredOf decodes JSON as the informers' objects are decoded.
func unstructuredOf(t testing.TB, doc []byte) (any, bool) {
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(doc); err != nil {
		return nil, false
	}
	return u.Object, true
}

func checkSameAsEncodingJSON(t testing.TB, v any) {
	want, err := json.Marshal(v)
	if err != nil {
		return
	}
	if got := appendJSON(nil, v); !bytes.Equal(got, want) {
		t.Fatalf("appendJSON:\n%s\nencoding/json:\n%s", got, want)
	}
}

func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	files, _ := filepath.Glob("../dynamicinformer/testdata/transform/*.input.yaml") // the transform's sample objects
	if len(files) == 0 {
		t.Fatal("no sample objects found")
	}
	for _, f := range files {
		y, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := yaml.YAMLToJSON(y)
		if err != nil {
			t.Fatal(err)
		}
		v, ok := unstructuredOf(t, doc)
		if !ok {
			t.Fatalf("%s does not decode", f)
		}
		checkSameAsEncodingJSON(t, v)
	}
	checkSameAsEncodingJSON(t, map[string]any{
		"kind": "X", "html": "<a href='x'>&</a>", "quote": `say "hi"\n`, "ctl": "a\tb\x01", "utf8": "héllo ✓ \u2028",
		"bad": "\xff", "float": 1.5, "big": 1e21, "neg": int64(-3), "t": true, "nil": nil, "list": []any{int64(1), "two", []any{}},
		"empty": map[string]any{}, "int": 7,
	})
}

// FuzzAppendJSON holds the encoder to encoding/json on arbitrary JSON documents.
func FuzzAppendJSON(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a<b>","labels":{"app":"web"}},"data":{"x":"\u00e9\n"}}`))
	f.Add([]byte(`{"kind":"X","spec":{"replicas":3,"ratio":0.25,"list":[1,"a",null,true,{"b":[]}]}}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		if v, ok := unstructuredOf(t, doc); ok {
			checkSameAsEncodingJSON(t, v)
		}
	})
}
