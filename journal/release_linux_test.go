package journal

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/dynwatch/dynwatch/dynamicinformer"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// rssFile is the process's file-backed resident memory, in bytes.
func rssFile(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "RssFile:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// TestReleaseDropsTheStoresPagesFromResidentMemory writes 32 MB to the store (16 MB of objects, 16 MB of outbox), reads all of it
// back through its memory map, and releases it: the file-backed resident memory falls by
// about that much, and what is read afterwards is still all there.
func TestReleaseDropsTheStoresPagesFromResidentMemory(t *testing.T) {
	j, _ := newJournal(t)
	payload := strings.Repeat("x", 8<<10)
	const n = 2048
	for i := range n {
		e := addedAt(fmt.Sprintf("cm-%05d", i), uint64(i+1))
		u, err := e.Object.Decode()
		if err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedField(u.Object, payload, "data", "payload"); err != nil {
			t.Fatal(err)
		}
		e.Object = dynamicinformer.NewObject(u)
		j.Record(e)
	}
	flush(t, j)
	read := func() int {
		read := 0
		if _, _, err := j.ReadOutbox("sink", 0, 0, func(Entry) bool { read++; return true }); err != nil {
			t.Fatal(err)
		}
		return read
	}
	if got := read(); got != n {
		t.Fatalf("%d outbox entries; want %d", got, n)
	}
	before := rssFile(t)
	if err := j.store.release(); err != nil {
		t.Fatal(err)
	}
	after := rssFile(t)
	if drop := before - after; drop < 16<<20 {
		t.Errorf("file-backed resident memory fell by %d MB (from %d to %d MB); want at least 16", drop>>20, before>>20, after>>20)
	}
	if got := read(); got != n {
		t.Errorf("after release: %d outbox entries; want %d", got, n)
	}
}
