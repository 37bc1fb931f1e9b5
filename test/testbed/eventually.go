package testbed

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// LockedBuffer is a bytes.Buffer safe for concurrent use: a log or output destination that
// several goroutines (or a child process's readers) write while a test reads it.
type LockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Eventually polls cond every 50ms until it returns nil, and fails the test with cond's last
// error if that has not happened within timeout.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: %v", timeout, err)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("test ended while waiting: %v", err)
		case <-tick.C:
		}
	}
}
