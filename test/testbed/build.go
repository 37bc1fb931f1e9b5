package testbed

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
)

// KubernetesVersion is the version of kube-apiserver and kubectl the test bed runs.
const KubernetesVersion = "v1.36.3"

// HelmVersion is the version of helm the chart's tests use.
const HelmVersion = "v4.3.1"

// PrometheusVersion is the Go module version of Prometheus (v0.316.0 is Prometheus 3.16.0)
// whose prometheus and promtool the alerting rules' tests run.
const PrometheusVersion = "v0.316.0"

// prometheusRelease is the release PrometheusVersion stands for, which the binaries report.
const prometheusRelease = "3.16.0"

// NATSServerVersion is the version of nats-server the JetStream sink's tests run.
const NATSServerVersion = "v2.15.2"

// Binaries are the paths of the test bed's executables.
type Binaries struct {
	APIServer string
	Etcd      string
	Kubectl   string
	Helm      string
	// Prometheus and Promtool are built without service discovery (tag remove_all_sd): the
	// tests scrape static targets on 127.0.0.1.
	Prometheus string
	Promtool   string
	// NATSServer is nats-server, for the JetStream sink's clusters.
	NATSServer string
}

var ldflags = "-s -w" +
	" -X k8s.io/component-base/version.gitVersion=" + KubernetesVersion +
	" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36" +
	" -X k8s.io/client-go/pkg/version.gitVersion=" + KubernetesVersion +
	" -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=36"

// packages are built in the test/tools module, except those named with a version (pkg@v),
// which go install builds from their own modules.
var packages = []struct{ name, pkg, tags, ldflags string }{
	{"etcd", "go.etcd.io/etcd/server/v3", "", ldflags},
	{"kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", "", ldflags},
	{"kubectl", "k8s.io/kubernetes/cmd/kubectl", "", ldflags},
	{"helm", "helm.sh/helm/v4/cmd/helm@" + HelmVersion, "", ""},
	{"prometheus", "github.com/prometheus/prometheus/cmd/prometheus@" + PrometheusVersion, "remove_all_sd", prometheusLDFlags},
	{"promtool", "github.com/prometheus/prometheus/cmd/promtool@" + PrometheusVersion, "remove_all_sd", prometheusLDFlags},
	{"nats-server", "github.com/nats-io/nats-server/v2@" + NATSServerVersion, "", "-s -w"},
}

var prometheusLDFlags = "-s -w -X github.com/prometheus/common/version.Version=" + prometheusRelease

// toolsDir is the test/tools module, found next to this source file.
func toolsDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("locate test/tools: no caller information")
	}
	dir := filepath.Join(filepath.Dir(file), "..", "tools")
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return "", fmt.Errorf("locate test/tools: %w", err)
	}
	return dir, nil
}

func cacheRoot() (string, error) {
	if dir := os.Getenv("DYNWATCH_TESTBED_CACHE"); dir != "" {
		return dir, nil
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("find a cache directory (set DYNWATCH_TESTBED_CACHE): %w", err)
	}
	return filepath.Join(dir, "dynwatch-testbed"), nil
}

// EnsureBinaries returns the test bed's binaries, building any that are missing. The first
// build takes several minutes; progress goes to out.
func EnsureBinaries(ctx context.Context, out io.Writer) (Binaries, error) {
	tools, err := toolsDir()
	if err != nil {
		return Binaries{}, err
	}
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(tools, f))
		if err != nil {
			return Binaries{}, fmt.Errorf("read test/tools: %w", err)
		}
		h.Write(b)
	}
	h.Write([]byte(ldflags + HelmVersion + prometheusLDFlags + PrometheusVersion + NATSServerVersion))
	root, err := cacheRoot()
	if err != nil {
		return Binaries{}, err
	}
	dir := filepath.Join(root, KubernetesVersion+"-"+hex.EncodeToString(h.Sum(nil))[:12])
	bins := Binaries{
		APIServer:  filepath.Join(dir, "kube-apiserver"),
		Etcd:       filepath.Join(dir, "etcd"),
		Kubectl:    filepath.Join(dir, "kubectl"),
		Helm:       filepath.Join(dir, "helm"),
		Prometheus: filepath.Join(dir, "prometheus"),
		Promtool:   filepath.Join(dir, "promtool"),
		NATSServer: filepath.Join(dir, "nats-server"),
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Binaries{}, fmt.Errorf("create binary cache: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return Binaries{}, fmt.Errorf("lock binary cache: %w", err)
	}
	defer func() { _ = lock.Close() }() // nothing is written to it; closing releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return Binaries{}, fmt.Errorf("lock binary cache: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing releases it too
	for _, p := range packages {
		target := filepath.Join(dir, p.name)
		if _, err := os.Stat(target); err == nil {
			continue
		}
		fmt.Fprintf(out, "testbed: building %s (%s) into %s; the first build takes minutes\n", p.name, p.pkg, dir)
		tmp := target + ".tmp"
		cmd := exec.CommandContext(ctx, "go", "build", "-o", tmp, "-ldflags", p.ldflags, p.pkg)
		cmd.Dir = tools
		if strings.Contains(p.pkg, "@") {
			gobin, err := os.MkdirTemp(dir, "gobin-")
			if err != nil {
				return Binaries{}, err
			}
			defer func() { _ = os.RemoveAll(gobin) }() // a leftover temporary directory harms nothing
			cmd = exec.CommandContext(ctx, "go", "install", "-tags", p.tags, "-ldflags", p.ldflags, p.pkg)
			cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOFLAGS=-mod=mod")
			tmp = filepath.Join(gobin, p.name)
		}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			return Binaries{}, fmt.Errorf("build %s: %w", p.pkg, err)
		}
		if err := os.Rename(tmp, target); err != nil {
			return Binaries{}, fmt.Errorf("install %s: %w", p.name, err)
		}
	}
	return bins, nil
}
