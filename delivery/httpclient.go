package delivery

import (
	"crypto/tls"
	"net"
	"net/http"
	"time"
)

// newClient returns an HTTP client with its own transport (see HTTPTransport) and timeout. It
// does not follow redirects: a POST must not turn into a GET.
func newClient(tlsConfig *tls.Config, workers int, timeout time.Duration, f Fence) *http.Client {
	return &http.Client{
		Transport:     HTTPTransport(tlsConfig, workers, f),
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// HTTPTransport returns an HTTP transport keeping one idle connection per worker, whose
// connections write nothing once the fence has lapsed, through a proxy from the environment
// when one applies: dead-letter targets', and a webhook's that a proxy leads to.
func HTTPTransport(tlsConfig *tls.Config, workers int, f Fence) *http.Transport {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	dial := FencedDialer(f, dialer.DialContext)
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dial,
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConns:          workers,
		MaxIdleConnsPerHost:   workers,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
		TLSClientConfig:       tlsConfig.Clone(), // nil stays nil
		// Room for the headers and a typical body, so that a request is one write.
		WriteBufferSize: 64 << 10,
	}
}
