package testbed

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestAFullFaultFSRefusesWritesToFilesOpenBeforeAndAfter: the faults the tests rely on are real.
// With the filesystem full, a write to a file opened before fails with ENOSPC, as does creating
// a file; with its space back, both work again.
func TestAFullFaultFSRefusesWritesToFilesOpenBeforeAndAfter(t *testing.T) {
	if err := FUSEAvailable(); err != nil {
		t.Skip(err)
	}
	x, err := MountFaultFS(t.TempDir(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := x.Unmount(); err != nil {
			t.Error(err)
		}
	})
	f, err := os.OpenFile(filepath.Join(x.Dir, "a"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // its writes are checked one by one
	if _, err := f.WriteAt([]byte("before"), 0); err != nil {
		t.Fatal(err)
	}
	x.Fill(true)
	if _, err := f.WriteAt([]byte("full"), 6); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a write with the filesystem full: %v; want ENOSPC", err)
	}
	if _, err := os.Create(filepath.Join(x.Dir, "b")); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a file created with the filesystem full: %v; want ENOSPC", err)
	}
	x.Fill(false)
	if _, err := f.WriteAt([]byte("after"), 6); err != nil {
		t.Fatalf("a write with the space back: %v", err)
	}
}
