// Package repo_test checks what the repository tracks.
package repo_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/dynwatch/dynwatch/test/runner"
)

// maxTracked is the size above which a tracked file is most likely build output.
const maxTracked = 2 << 20

// largeOnPurpose lists the tracked files allowed over maxTracked, each with its reason.
var largeOnPurpose = map[string]string{}

// TestNoTrackedFileIsBuildOutput: every clone carries every tracked file; a binary or a
// benchmark's output committed by mistake makes each one slower for good.
func TestNoTrackedFileIsBuildOutput(t *testing.T) {
	root := runner.Root(t)
	cmd := exec.CommandContext(t.Context(), "git", "ls-files", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("not a git checkout (git ls-files: %v): nothing is tracked", err)
	}
	n := 0
	for name := range bytes.SplitSeq(bytes.TrimSuffix(out, []byte{0}), []byte{0}) {
		info, err := os.Lstat(filepath.Join(root, string(name)))
		if err != nil {
			continue // deleted in the work tree, not yet in the index
		}
		n++
		if info.Size() > maxTracked {
			if _, ok := largeOnPurpose[string(name)]; !ok {
				t.Errorf("%s is tracked and has %.1f MB: build output? (git rm --cached it and ignore it, or list it in largeOnPurpose with its reason)", name, float64(info.Size())/(1<<20))
			}
		}
	}
	if n == 0 {
		t.Fatal("git ls-files listed no file")
	}
}
