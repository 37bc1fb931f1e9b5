package app

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/dynamicinformer"
)

// TestTheInformersStreamsGoOverHTTP1UnlessHTTP2IsSet: the informers' client asks a server
// that offers HTTP/2 for HTTP/1.1, unless client.http2 is set; the other concerns' clients
// keep client-go's HTTP/2.
func TestTheInformersStreamsGoOverHTTP1UnlessHTTP2IsSet(t *testing.T) {
	protos := make(chan int, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		protos <- r.ProtoMajor
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	base := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	limit := config.RateLimit{QPS: 100, Burst: 100}

	for _, c := range []struct {
		name  string
		cfg   *rest.Config
		major int
	}{
		{"the informers' client, by default", forInformers(base, config.Client{RateLimits: config.RateLimits{Informers: limit}}), 1},
		{"the informers' client with client.http2", forInformers(base, config.Client{HTTP2: true, RateLimits: config.RateLimits{Informers: limit}}), 2},
		{"the reads' client", forConcern(base, "reads", limit), 2},
	} {
		client, err := dynamicinformer.NewJSONClient(c.cfg) // the client of the informers' object streams
		if err != nil {
			t.Fatal(err)
		}
		if err := client.Get().AbsPath("/version").Do(t.Context()).Error(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := <-protos; got != c.major {
			t.Errorf("%s: HTTP/%d; want HTTP/%d", c.name, got, c.major)
		}
	}
}
