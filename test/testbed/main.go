package testbed

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// Main starts one Cluster for a test package, stores it in *c, runs the package's tests and
// stops the cluster. It returns the exit code for os.Exit:
//
//	var cluster *testbed.Cluster
//
//	func TestMain(m *testing.M) { os.Exit(testbed.Main(m, &cluster)) }
func Main(m *testing.M, c **Cluster) int {
	// The first run builds the binaries, which takes minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cluster, err := Start(ctx, Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "testbed:", err)
		return 1
	}
	defer cluster.Stop()
	*c = cluster
	return m.Run()
}
