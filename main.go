// Command dynwatch watches any set of Kubernetes resources through dynamic informers and serves
// their state and changes. See README.md and docs/.
//
// main turns flags and signals into app.Options and a context, and app.Run's error into an
// exit code; everything else is in package app.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/dynwatch/dynwatch/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	reload := make(chan os.Signal, 1)
	signal.Notify(reload, syscall.SIGHUP)
	err := run(ctx, os.Args[1:], reload)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "dynwatch: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, reload <-chan os.Signal) error {
	flags := flag.NewFlagSet("dynwatch", flag.ContinueOnError)
	configPath := flags.String("config", "", "path of the YAML configuration file (required)")
	kubeconfig := flags.String("kubeconfig", "", "path of a kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	return app.Run(ctx, app.Options{ConfigPath: *configPath, Kubeconfig: *kubeconfig, Reload: reload})
}
