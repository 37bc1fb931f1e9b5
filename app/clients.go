package app

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dynwatch/dynwatch/config"
)

// clientGates are client-go's feature gates with ClientsAllowCBOR as configured. With it, the
// dynamic clients send Accept: application/json;q=0.9,application/cbor;q=1 and decode whichever
// the apiserver chose; requests they send stay JSON (ClientsPreferCBOR stays off).
type clientGates struct {
	base clientfeatures.Gates
	cbor bool
}

func (g clientGates) Enabled(f clientfeatures.Feature) bool {
	if f == clientfeatures.ClientsAllowCBOR {
		return g.cbor
	}
	return g.base.Enabled(f)
}

// encodings counts the apiserver's responses by the encoding it chose, so that an operator (and
// a test) can see whether client.cbor is in effect.
type encodings struct{ responses *prometheus.CounterVec }

func newEncodings() encodings {
	e := encodings{responses: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dynwatch_apiserver_responses_total",
		Help: "Responses from the apiserver to dynwatch's own requests, by encoding (cbor, json, protobuf, other).",
	}, []string{"encoding"})}
	for _, enc := range []string{"cbor", "json", "protobuf", "other"} {
		e.responses.WithLabelValues(enc)
	}
	return e
}

func (e encodings) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil {
			e.responses.WithLabelValues(encodingOf(resp.Header.Get("Content-Type"))).Inc()
		}
		return resp, err
	})
}

// encodingOf names the encoding of a response's Content-Type.
func encodingOf(contentType string) string {
	media, _, _ := mime.ParseMediaType(contentType)
	switch media {
	case "application/cbor", "application/cbor-seq":
		return "cbor"
	case "application/json":
		return "json"
	case "application/vnd.kubernetes.protobuf":
		return "protobuf"
	}
	return "other"
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// forConcern is base for one of dynwatch's concerns (informers, leader-election, reviews,
// reads): its own client-side rate limit, so that no concern's requests wait behind another's
// (a flood of callers cannot delay a Lease renewal), and its own User-Agent, dynwatch/<concern>,
// so that the apiserver's metrics and audit log tell them apart.
func forConcern(base *rest.Config, concern string, l config.RateLimit) *rest.Config {
	c := rest.CopyConfig(base)
	c.QPS, c.Burst = l.QPS, l.Burst
	c.UserAgent = base.UserAgent + "/" + concern
	return c
}

// Keepalive probes of the informers' HTTP/1.1 connections: a connection silent for
// keepAliveIdle is probed every keepAliveInterval, and given up after keepAliveProbes
// unanswered, so that a watch whose apiserver vanished without closing it (its node lost, a
// network partition) fails within about 30 s and is made again, as HTTP/2's pings find it
// (client-go: 30 s without a frame, then 15 s for the ping's answer).
const (
	keepAliveIdle     = 15 * time.Second
	keepAliveInterval = 5 * time.Second
	keepAliveProbes   = 3
	dialTimeout       = 30 * time.Second // client-go's
)

// forInformers is forConcern(base, "informers", …) for the informers' lists, watches and
// discovery: over HTTP/1.1 unless c.HTTP2 (see config.Client.HTTP2), on connections kept alive
// by probes that find a dead one.
func forInformers(base *rest.Config, c config.Client) *rest.Config {
	cfg := forConcern(base, "informers", c.RateLimits.Informers)
	if c.HTTP2 {
		return cfg
	}
	cfg.NextProtos = []string{"http/1.1"} // without "h2", client-go leaves HTTP/2 off
	dialer := &net.Dialer{Timeout: dialTimeout, KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveProbes,
	}}
	cfg.Dial = dialer.DialContext
	return cfg
}

// clientConfig resolves the apiserver connection as client-go tools do: the kubeconfig path,
// then $KUBECONFIG, then ~/.kube/config, then the in-cluster service account.
func clientConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	c, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	c.UserAgent = "dynwatch"
	return c, nil
}
