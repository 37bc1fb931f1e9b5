package dynamicinformer

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/dynwatch/dynwatch/config"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

func loadResource(t *testing.T, path string) *config.Resource {
	t.Helper()
	c, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return &c.Resources[0]
}

func readObject(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(b, &u.Object); err != nil {
		t.Fatal(err)
	}
	return u
}

// TestTransformGolden applies each testdata/transform/NAME.config.yaml to NAME.input.yaml and
// compares the result with NAME.golden.yaml (go test -run TestTransformGolden -update rewrites
// them). Applying the transform a second time must change nothing.
func TestTransformGolden(t *testing.T) {
	configs, _ := filepath.Glob("testdata/transform/*.config.yaml")
	if len(configs) == 0 {
		t.Fatal("no golden cases found")
	}
	for _, cfgPath := range configs {
		name := strings.TrimSuffix(filepath.Base(cfgPath), ".config.yaml")
		t.Run(name, func(t *testing.T) {
			transform := NewTransform(loadResource(t, cfgPath))
			obj := readObject(t, filepath.Join("testdata/transform", name+".input.yaml"))
			out, err := transform(obj)
			if err != nil {
				t.Fatal(err)
			}
			got, err := yaml.Marshal(out.(*unstructured.Unstructured).Object)
			if err != nil {
				t.Fatal(err)
			}
			goldenPath := filepath.Join("testdata/transform", name+".golden.yaml")
			if *update {
				if err := os.WriteFile(goldenPath, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(goldenPath)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("transform of %s.input.yaml:\n%s\nwant (%s):\n%s", name, got, goldenPath, want)
			}
			again, _ := transform(out)
			if twice, _ := yaml.Marshal(again.(*unstructured.Unstructured).Object); !bytes.Equal(twice, got) {
				t.Errorf("transform is not idempotent: second application gave\n%s", twice)
			}
		})
	}
}

func TestTransformPassesOtherTypesThrough(t *testing.T) {
	transform := NewTransform(loadResource(t, "testdata/transform/secret.config.yaml"))
	in := "not an object"
	if out, err := transform(in); err != nil || out != in {
		t.Fatalf("transform(%q) = %v, %v; want it unchanged", in, out, err)
	}
}
