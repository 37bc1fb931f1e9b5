package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// gofailModule is the failpoint library's module: its tool rewrites the failpoint comments, and
// the code it writes imports its runtime.
const gofailModule = "go.etcd.io/gofail"

// BuildWithFailpoints compiles dynwatch as Build does, from a copy of its source in dir whose
// failpoints are enabled: the "// gofail:" comments, which a plain build ignores, become code
// (gofail, pinned by test/tools/go.mod). A failpoint is set by the process's environment
// (GOFAIL_FAILPOINTS="name=term;..."), or over HTTP at GOFAIL_HTTP (a loopback address).
func BuildWithFailpoints(ctx context.Context, dir string, race bool) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	src := filepath.Join(dir, "src")
	dirs, err := copySource(root, src)
	if err != nil {
		return "", fmt.Errorf("copy dynwatch's source: %w", err)
	}
	tools := filepath.Join(root, "test", "tools")
	if _, err := command(ctx, tools, "go", append([]string{"tool", "gofail", "enable"}, dirs...)...); err != nil {
		return "", err
	}
	// The failpoints' code imports gofail's runtime, at the tool's version.
	version, err := command(ctx, tools, "go", "list", "-m", "-f", "{{.Version}}", gofailModule)
	if err != nil {
		return "", err
	}
	if _, err := command(ctx, src, "go", "mod", "edit", "-require="+gofailModule+"@"+strings.TrimSpace(version)); err != nil {
		return "", err
	}
	if err := copySums(filepath.Join(tools, "go.sum"), filepath.Join(src, "go.sum"), gofailModule+" "); err != nil {
		return "", err
	}
	return build(ctx, src, dir, race)
}

// copySource copies the dynwatch module's Go source and go.mod and go.sum from root to dst,
// leaving out what a build of it does not read (test/, with its modules of their own, charts,
// docs, the repository's history), and returns the directories that hold failpoints.
func copySource(root, dst string) ([]string, error) {
	skip := []string{".git", "bin", "charts", "docs", "test"}
	var failpoints []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if slices.Contains(skip, rel) {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !strings.HasSuffix(rel, ".go") && rel != "go.mod" && rel != "go.sum" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go") && bytes.Contains(b, []byte("// gofail:")) {
			failpoints = append(failpoints, filepath.Join(dst, rel))
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	return failpoints, err
}

// copySums appends to the go.sum file dst the lines of src that begin with prefix.
func copySums(src, dst, prefix string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	var lines []byte
	for line := range bytes.Lines(b) {
		if bytes.HasPrefix(line, []byte(prefix)) {
			lines = append(lines, line...)
		}
	}
	f, err := os.OpenFile(dst, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(lines)
	return errors.Join(err, f.Close())
}

// command runs name with args in dir and returns its standard output.
func command(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, stderr.Bytes())
	}
	return string(out), nil
}
