// Command dynwatch watches any set of Kubernetes resources through dynamic informers and serves
// their state and changes. See README.md and docs/.
//
// main runs itself again with the Go runtime's environment dynwatch needs (app.RuntimeEnvironment),
// turns flags and signals into app.Options and a context, and app.Run's error into an exit
// code; everything else is in package app.
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
	execWithRuntimeEnvironment()
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

// execWithRuntimeEnvironment replaces the process (execve: the same PID, arguments and open
// files) with the same executable under app.RuntimeEnvironment's environment, which the Go
// runtime reads only as it starts; it returns only when there is nothing to change, or when
// that failed, which it says, and dynwatch runs on with the runtime's defaults.
func execWithRuntimeEnvironment() {
	env, changed := app.RuntimeEnvironment(os.Environ())
	if !changed {
		return
	}
	exe, err := os.Executable()
	if err == nil {
		err = syscall.Exec(exe, os.Args, env)
	}
	fmt.Fprintf(os.Stderr, "dynwatch: running with the Go runtime's default system monitor: %v\n", err)
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
