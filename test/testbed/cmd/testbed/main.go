// Command testbed builds the test bed's binaries, helm included (`testbed build`) or runs a local etcd and
// kube-apiserver until interrupted (`testbed up`), printing the kubeconfig to use with dynwatch
// and kubectl.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/dynwatch/dynwatch/test/testbed"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "testbed:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: testbed build|up")
	}
	switch args[0] {
	case "build":
		bins, err := testbed.EnsureBinaries(ctx, os.Stderr)
		if err != nil {
			return err
		}
		fmt.Printf("kube-apiserver: %s\netcd: %s\nkubectl: %s\nhelm: %s\nprometheus: %s\npromtool: %s\nnats-server: %s\n", bins.APIServer, bins.Etcd, bins.Kubectl, bins.Helm, bins.Prometheus, bins.Promtool, bins.NATSServer)
		return nil
	case "up":
		c, err := testbed.Start(ctx, testbed.Options{})
		if err != nil {
			return err
		}
		defer c.Stop()
		fmt.Printf("kube-apiserver %s ready at %s\n\n  export KUBECONFIG=%s\n  alias kubectl=%s\n\nPress Ctrl-C to stop.\n",
			testbed.KubernetesVersion, c.URL(), c.Kubeconfig, c.Binaries.Kubectl)
		<-ctx.Done()
		return nil
	default:
		return fmt.Errorf("unknown command %q: usage: testbed build|up", args[0])
	}
}
