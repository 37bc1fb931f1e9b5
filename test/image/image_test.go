// Package image_test checks the container image's recipe without a container engine: it
// assembles the build context exactly as .dockerignore admits it, replays the Dockerfile's
// build stage (WORKDIR, COPY, RUN) in a directory standing for the stage's filesystem, and
// checks what the final stage takes from it and the ports it exposes.
package image_test

import (
	"bytes"
	"errors"
	"fmt"
	"go/version"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/test/runner"
)

// stages parses the Dockerfile into its stages.
func stages(t *testing.T, root string) []instructions.Stage {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read only
	ast, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("parse the Dockerfile: %v", err)
	}
	st, _, err := instructions.Parse(ast.AST, nil)
	if err != nil {
		t.Fatalf("parse the Dockerfile's instructions: %v", err)
	}
	if len(st) < 2 {
		t.Fatalf("the Dockerfile has %d stages; want a build stage and the image", len(st))
	}
	return st
}

// buildContext copies into dir every file of root that .dockerignore admits.
func buildContext(t *testing.T, root, dir string) {
	t.Helper()
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	patterns, err := ignorefile.ReadAll(f)
	_ = f.Close() // read only
	if err != nil {
		t.Fatalf("read .dockerignore: %v", err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatalf(".dockerignore: %v", err)
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		denied, err := pm.MatchesOrParentMatches(filepath.ToSlash(rel))
		if err != nil {
			return err
		}
		switch {
		case denied && d.IsDir() && !pm.Exclusions():
			return filepath.SkipDir
		case denied || d.IsDir() || !d.Type().IsRegular():
			return nil
		}
		return copyFile(p, filepath.Join(dir, rel))
	})
	if err != nil {
		t.Fatalf("assemble the build context: %v", err)
	}
}

func copyFile(from, to string) error {
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }() // read only
	info, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, info.Mode().Perm())
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

// replayCopy copies the sources of a COPY from the context into dest, an absolute path in the
// stage's filesystem rooted at fsRoot, as Docker does: a directory's contents, a file into a
// destination that ends in "/".
func replayCopy(ctxDir, fsRoot, workdir string, c *instructions.CopyCommand) error {
	dest := c.DestPath
	if !path.IsAbs(dest) {
		dest = path.Join(workdir, dest) + map[bool]string{true: "/"}[strings.HasSuffix(c.DestPath, "/") || c.DestPath == "."]
	}
	for _, src := range c.SourcePaths {
		from := filepath.Join(ctxDir, filepath.FromSlash(src))
		info, err := os.Stat(from)
		if err != nil {
			return fmt.Errorf("COPY %s: not in the build context: %w", src, err)
		}
		if !info.IsDir() {
			to := dest
			if strings.HasSuffix(dest, "/") {
				to = path.Join(dest, path.Base(src))
			}
			if err := copyFile(from, filepath.Join(fsRoot, to)); err != nil {
				return err
			}
			continue
		}
		err = filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(from, p)
			return copyFile(p, filepath.Join(fsRoot, dest, rel))
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// TestTheImageBuildsFromItsContext replays the build stage and checks that the binary the final
// stage copies is there. A package left out of the context fails the build; a build stage
// whose Go is older than go.mod asks for fails the version check.
func TestTheImageBuildsFromItsContext(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the whole binary: not in the unit tier")
	}
	root := runner.Root(t)
	st := stages(t, root)
	build, final := st[0], st[len(st)-1]

	goMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	var goVersion string
	for line := range strings.Lines(string(goMod)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "go "); ok {
			goVersion = v
		}
	}
	image, tag, _ := strings.Cut(build.BaseName, ":")
	if image != "golang" || !version.IsValid("go"+goVersion) || version.Compare(version.Lang("go"+goVersion), "go"+tag) > 0 {
		t.Errorf("the build stage is FROM %s; want golang at go.mod's go %s or later", build.BaseName, goVersion)
	}

	ctxDir, fsRoot := t.TempDir(), t.TempDir()
	buildContext(t, root, ctxDir)
	workdir := "/"
	for _, cmd := range build.Commands {
		switch c := cmd.(type) {
		case *instructions.WorkdirCommand:
			workdir = path.Join(workdir, c.Path)
			if err := os.MkdirAll(filepath.Join(fsRoot, workdir), 0o755); err != nil {
				t.Fatal(err)
			}
		case *instructions.CopyCommand:
			if err := replayCopy(ctxDir, fsRoot, workdir, c); err != nil {
				t.Fatal(err)
			}
		case *instructions.RunCommand:
			sh := exec.CommandContext(t.Context(), "sh", "-c", strings.Join(c.CmdLine, " "))
			sh.Dir = filepath.Join(fsRoot, workdir)
			var out bytes.Buffer
			sh.Stdout, sh.Stderr = &out, &out
			if err := sh.Run(); err != nil {
				t.Fatalf("RUN %s in the build stage: %v\n%s", c.CmdLine, err, out.String())
			}
		default:
			t.Fatalf("the build stage has %s, which this test does not replay", cmd.Name())
		}
	}

	var copied bool
	for _, cmd := range final.Commands {
		c, ok := cmd.(*instructions.CopyCommand)
		if !ok || c.From != build.Name {
			continue
		}
		for _, src := range c.SourcePaths {
			info, err := os.Stat(filepath.Join(fsRoot, src))
			if err != nil || info.Mode()&0o111 == 0 {
				t.Errorf("COPY --from=%s %s: the build stage made no executable there (%v)", build.Name, src, err)
			}
			copied = true
		}
	}
	if !copied {
		t.Errorf("the image copies nothing from the %s stage", build.Name)
	}
}

// TestTheImageExposesThePortsTheBinaryListensOn: EXPOSE names the ports of api.address and
// metrics.address by default.
func TestTheImageExposesThePortsTheBinaryListensOn(t *testing.T) {
	st := stages(t, runner.Root(t))
	var exposed []string
	for _, cmd := range st[len(st)-1].Commands {
		if c, ok := cmd.(*instructions.ExposeCommand); ok {
			exposed = append(exposed, c.Ports...)
		}
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("resources: [{version: v1, resource: configmaps}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, addr := range []string{cfg.API.Address, cfg.Metrics.Address} {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, port)
	}
	slices.Sort(exposed)
	slices.Sort(want)
	if !slices.Equal(exposed, want) {
		t.Errorf("the image exposes %v; the binary listens on %v by default", exposed, want)
	}
}
