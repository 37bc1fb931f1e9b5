package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// FaultFS is a directory served through FUSE, by the test's own process, from another
// directory, whose faults the test turns on and off while a program writes there: a full disk
// (writes, allocations and new files fail with ENOSPC) and stalled syncs (fsync and fdatasync
// do not return until released). The program sees a real filesystem and the real errors,
// from the kernel. It needs /dev/fuse and the right to mount (root).
type FaultFS struct {
	// Dir is where the filesystem is mounted.
	Dir    string
	server *fuse.Server
	f      *faults
}

// faults are a FaultFS's switches, shared by all its nodes and files.
type faults struct {
	full atomic.Bool
	mu   sync.Mutex
	held chan struct{} // non-nil while syncs are held: closed to release them
	// syncs counts the fsyncs that have returned or are held.
	syncs atomic.Int64
}

// MountFaultFS mounts at mountpoint, which must exist and be empty, the directory backing.
// Unmount it before the test ends.
func MountFaultFS(backing, mountpoint string) (*FaultFS, error) {
	root, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		return nil, fmt.Errorf("loopback of %s: %w", backing, err)
	}
	loop, ok := root.(*fs.LoopbackNode)
	if !ok {
		return nil, fmt.Errorf("loopback root is a %T", root)
	}
	f := &faults{}
	server, err := fs.Mount(mountpoint, &faultNode{LoopbackNode: loop, f: f}, &fs.Options{
		MountOptions: fuse.MountOptions{DirectMount: true, FsName: "dynwatch-faultfs", Name: "faultfs"},
	})
	if err != nil {
		return nil, fmt.Errorf("mount FUSE at %s: %w", mountpoint, err)
	}
	return &FaultFS{Dir: mountpoint, server: server, f: f}, nil
}

// Fill makes the filesystem full (true) or gives its space back (false).
func (x *FaultFS) Fill(full bool) { x.f.full.Store(full) }

// HoldSyncs makes every fsync and fdatasync wait until ReleaseSyncs.
func (x *FaultFS) HoldSyncs() {
	x.f.mu.Lock()
	defer x.f.mu.Unlock()
	if x.f.held == nil {
		x.f.held = make(chan struct{})
	}
}

// ReleaseSyncs lets the held syncs, and those that follow, return.
func (x *FaultFS) ReleaseSyncs() {
	x.f.mu.Lock()
	defer x.f.mu.Unlock()
	if x.f.held != nil {
		close(x.f.held)
		x.f.held = nil
	}
}

// Syncs counts the fsyncs and fdatasyncs the filesystem has been asked for.
func (x *FaultFS) Syncs() int64 { return x.f.syncs.Load() }

// Unmount releases the held syncs and unmounts the filesystem; a program with files still
// open there gets errors from then on.
func (x *FaultFS) Unmount() error {
	x.ReleaseSyncs()
	x.Fill(false)
	err := x.server.Unmount()
	if err != nil {
		// Busy: files are still open. Detach it: the kernel lets go once they are closed.
		err = errors.Join(err, syscall.Unmount(x.Dir, syscall.MNT_DETACH))
		if err == nil || errors.Is(err, syscall.EINVAL) {
			return nil
		}
	}
	return err
}

// faultNode is a loopback node whose files are faultFiles; its children are faultNodes too.
type faultNode struct {
	*fs.LoopbackNode
	f *faults
}

var (
	_ fs.NodeWrapChilder = (*faultNode)(nil)
	_ fs.NodeOpener      = (*faultNode)(nil)
	_ fs.NodeCreater     = (*faultNode)(nil)
)

func (n *faultNode) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if loop, ok := ops.(*fs.LoopbackNode); ok {
		return &faultNode{LoopbackNode: loop, f: n.f}
	}
	return ops
}

func (n *faultNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	return n.wrap(fh), fuseFlags, errno
}

func (n *faultNode) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if n.f.full.Load() {
		return nil, nil, 0, syscall.ENOSPC
	}
	inode, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	return inode, n.wrap(fh), fuseFlags, errno
}

func (n *faultNode) wrap(fh fs.FileHandle) fs.FileHandle {
	if loop, ok := fh.(*fs.LoopbackFile); ok {
		return &faultFile{LoopbackFile: loop, f: n.f}
	}
	return fh
}

// faultFile is a loopback file that fails writes while its filesystem is full and holds its
// syncs while they are held.
type faultFile struct {
	*fs.LoopbackFile
	f *faults
}

// PassthroughFd says no: a loopback file offers the kernel its descriptor, and a kernel that
// takes it (FUSE passthrough, Linux 6.9 on) reads and writes the backing file itself, past
// every fault here.
func (x *faultFile) PassthroughFd() (int, bool) { return 0, false }

func (x *faultFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if x.f.full.Load() {
		return 0, syscall.ENOSPC
	}
	return x.LoopbackFile.Write(ctx, data, off)
}

func (x *faultFile) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	if x.f.full.Load() {
		return 0, syscall.ENOSPC
	}
	return x.LoopbackFile.Writev(ctx, data, off)
}

func (x *faultFile) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if x.f.full.Load() {
		return syscall.ENOSPC
	}
	return x.LoopbackFile.Allocate(ctx, off, size, mode)
}

func (x *faultFile) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	x.f.syncs.Add(1)
	x.f.mu.Lock()
	held := x.f.held
	x.f.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-ctx.Done():
			return syscall.EINTR
		}
	}
	return x.LoopbackFile.Fsync(ctx, flags)
}

// FUSEAvailable reports why a FaultFS cannot be mounted here, or nil.
func FUSEAvailable() error {
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open /dev/fuse: %w", err)
	}
	return f.Close()
}
