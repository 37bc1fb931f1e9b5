package main

import (
	"os"
	"strings"
	"testing"

	"github.com/dynwatch/dynwatch/test/runner"
)

// TestBinaryPagesNameThisProcesssOwnPages: the test binary's resident pages are found, are no
// more than its whole file-backed resident memory, and its running code is named by package.
func TestBinaryPagesNameThisProcesssOwnPages(t *testing.T) {
	p, err := binaryPages(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if file := runner.ResidentMemory(os.Getpid()).File; p.total == 0 || p.total > file {
		t.Errorf("the executable's resident pages: %d bytes; want some, and no more than RssFile's %d", p.total, file)
	}
	for _, pkg := range []string{"runtime", "testing"} {
		if p.byWhat[pkg] == 0 {
			t.Errorf("no resident text of package %s among %s", pkg, strings.Join(p.largest(30), ", "))
		}
	}
}

// TestPackageOfAFunctionsSymbol: methods, closures and generic instances are named by their
// package.
func TestPackageOfAFunctionsSymbol(t *testing.T) {
	for in, want := range map[string]string{
		"runtime.mallocgc":       "runtime",
		"github.com/x/y.(*T).M":  "github.com/x/y",
		"github.com/x/y.F.func1": "github.com/x/y",
		"sync/atomic.(*Pointer[go.shape.struct { a/b.c }]).Load": "sync/atomic",
		"k8s.io/api/core/v1.init":                                "k8s.io/api/core/v1",
	} {
		if got := packageOf(in); got != want {
			t.Errorf("packageOf(%q) = %q; want %q", in, got, want)
		}
	}
}
