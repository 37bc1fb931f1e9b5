package wal

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// appendChildEnv, when set to a directory, makes the test binary the child process of
// TestAFailedAppendLeavesNothingBehindAndTheLogAppendsAgainOnceTheErrorClears: a file size
// limit (RLIMIT_FSIZE) is the process's own, so the appends that run into it run in a process
// of their own.
const appendChildEnv = "WAL_TEST_APPEND_UNDER_A_FILE_SIZE_LIMIT"

func TestMain(m *testing.M) {
	if dir := os.Getenv(appendChildEnv); dir != "" {
		if err := json.NewEncoder(os.Stdout).Encode(appendUnderAFileSizeLimit(dir)); err != nil {
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const (
	childPayload = 1000
	// childLimit lets three frames through whole, then the header of the fourth and half its
	// payload: the fourth append's payload is written short, then fails with EFBIG.
	childLimit = 3*headerSize + 3*childPayload + headerSize + childPayload/2
)

// childReport is what the child process saw.
type childReport struct {
	Appended         int    // payloads appended before one failed
	Err              string // the failed append's error
	FileTooLarge     bool   // it was EFBIG, the file size limit
	SizeAfterFailure int64  // the segment's size once the failed append returned
	RetryErr         string // the error of the append made once the limit was lifted
	Setup            string // anything else that went wrong
}

// appendUnderAFileSizeLimit appends childPayload-byte payloads to the log in dir until one
// fails under childLimit, lifts the limit, and appends a short payload.
func appendUnderAFileSizeLimit(dir string) childReport {
	var rep childReport
	l, _, err := Open(dir, Options{}, func(Pos, []byte) error { return nil })
	if err != nil {
		rep.Setup = err.Error()
		return rep
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &lim); err != nil {
		rep.Setup = err.Error()
		return rep
	}
	// The Go runtime takes SIGXFSZ and does nothing with it, so the write fails with EFBIG.
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: childLimit, Max: lim.Max}); err != nil {
		rep.Setup = err.Error()
		return rep
	}
	for _, p := range payloads(10, childPayload) {
		if _, err := l.Append(p); err != nil {
			rep.Err, rep.FileTooLarge = err.Error(), errors.Is(err, unix.EFBIG)
			break
		}
		rep.Appended++
	}
	if st, err := os.Stat(filepath.Join(dir, segName(1))); err != nil {
		rep.Setup = err.Error()
	} else {
		rep.SizeAfterFailure = st.Size()
	}
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &lim); err != nil {
		rep.Setup = err.Error()
		return rep
	}
	if _, err := l.Append(payloads(1, 100)[0]); err != nil {
		rep.RetryErr = err.Error()
	}
	if err := l.Close(); err != nil {
		rep.Setup = err.Error()
	}
	return rep
}

func TestAFailedAppendLeavesNothingBehindAndTheLogAppendsAgainOnceTheErrorClears(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), appendChildEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child process: %v\n%s", err, stderr.Bytes())
	}
	var rep childReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("child's report %q: %v", out, err)
	}
	if rep.Setup != "" {
		t.Fatalf("child process: %s", rep.Setup)
	}
	if rep.Appended != 3 || !rep.FileTooLarge {
		t.Fatalf("child appended %d payloads, then: %q; want 3, then a file too large", rep.Appended, rep.Err)
	}
	whole := 3 * frameSize(childPayload)
	if rep.SizeAfterFailure != whole {
		t.Errorf("the segment held %d bytes after the failed append; want %d, the frames before it", rep.SizeAfterFailure, whole)
	}
	if rep.RetryErr != "" {
		t.Errorf("an append once the limit was lifted: %s", rep.RetryErr)
	}

	_, rec, got := openLog(t, dir)
	if rec != (Recovery{}) {
		t.Errorf("recovery: %+v; want none", rec)
	}
	want := concat(payloads(10, childPayload)[:3], payloads(1, 100))
	if diff := cmp.Diff(want, payloadsOf(got)); diff != "" {
		t.Errorf("replayed payloads (-the appends that succeeded +replayed):\n%s", diff)
	}
	if n := fileSize(t, filepath.Join(dir, segName(1))); n != whole+frameSize(100) {
		t.Errorf("the segment holds %d bytes; want %d", n, whole+frameSize(100))
	}
}

func TestASecondOpenOfALogAlreadyOpenFailsWithErrLocked(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	l, _, _ := openLog(t, dir)
	appendAll(t, l, []byte("a"))

	second, _, err := Open(dir, Options{}, func(Pos, []byte) error { return nil })
	if !errors.Is(err, ErrLocked) {
		if second != nil {
			_ = second.Close()
		}
		t.Fatalf("a second open of the log: %v; want ErrLocked", err)
	}
	appendAll(t, l, []byte("b"))
	closeLog(t, l)

	_, _, got := openLog(t, dir)
	if diff := cmp.Diff([][]byte{[]byte("a"), []byte("b")}, payloadsOf(got)); diff != "" {
		t.Errorf("replayed once the first was closed (-want +got):\n%s", diff)
	}
}

// cachedPages counts the pages of the file at path in the page cache: mincore(2) of a mapping,
// which faults nothing in (x/sys/unix has no wrapper for it).
func cachedPages(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // opened to read: nothing to lose
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Munmap(m) }() // a read-only mapping: nothing to lose
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestAppendedFramesLeaveAtMostADropBatchInThePageCache: what was synced is dropped from the
// page cache once a batch of it has been, so at most a batch and the last page are cached.
func TestAppendedFramesLeaveAtMostADropBatchInThePageCache(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	l, _, _ := openLog(t, dir)
	// 5000 bytes: frames begin and end inside pages, never on a boundary; 5 batches' worth.
	appendAll(t, l, payloads(5*dropBatch/5000, 5000)...)
	path := filepath.Join(dir, segName(1))
	if n, most := cachedPages(t, path), dropBatch/os.Getpagesize()+1; n > most {
		t.Errorf("%d pages of the segment (%d bytes) are in the page cache after the appends; want at most %d", n, fileSize(t, path), most)
	}
}
