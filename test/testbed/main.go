package testbed

import (
	"context"
	"flag"
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
//
// With -short it neither builds nor starts anything and *c stays nil: the package's unit tests
// run, and those that call Need skip.
func Main(m *testing.M, c **Cluster) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
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

// MainAll is Main for a package whose every test needs the test bed, such as the end-to-end
// tests: with -short it runs none of them and says so, instead of marking each with Need.
func MainAll(m *testing.M, c **Cluster) int {
	flag.Parse()
	if testing.Short() {
		fmt.Println("testbed: every test of this package needs the test bed; -short runs none")
		return 0
	}
	return Main(m, c)
}

// Need skips t under -short: t needs the test bed, which the unit tier neither builds nor
// starts.
func Need(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the test bed: not in the unit tier (-short)")
	}
}
