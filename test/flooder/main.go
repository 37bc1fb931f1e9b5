// Command flooder floods an HTTPS API with GETs, as an attacker with a pod in the cluster would,
// for the end-to-end tests of the query API's guard. It is a process of its own, built without
// the race detector, so that the test's own callers, whose answers the test times, do not wait
// behind the flood's goroutines in the test's scheduler: the flood takes the machine's cores
// from dynwatch and from them only as another pod's would.
//
// It sends -requests requests at once over -connections HTTP/2 connections for -for, each
// asking for -url with "{random}" replaced by 12 random hex characters, and with -token as its
// bearer token (a fresh random one per request when empty). At the end it prints one JSON line:
// how many requests it made, and how many were answered 429.
package main

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "flooder:", err)
		os.Exit(1)
	}
}

func run() error {
	url := flag.String("url", "", `the URL each request asks for; "{random}" is replaced by 12 random hex characters`)
	token := flag.String("token", "", "the bearer token; empty: a fresh random one per request")
	caFile := flag.String("ca", "", "the PEM file of the CA the server's certificate is checked against")
	requests := flag.Int("requests", 400, "requests at once")
	connections := flag.Int("connections", 8, "HTTP/2 connections they share")
	duration := flag.Duration("for", 30*time.Second, "how long the flood lasts")
	flag.Parse()
	if *url == "" || *caFile == "" || *connections < 1 || *requests < *connections {
		return errors.New("-url and -ca are required, and -requests must be at least -connections (at least 1)")
	}
	pem, err := os.ReadFile(*caFile)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return fmt.Errorf("-ca %s: no certificate", *caFile)
	}
	var made, busy atomic.Int64
	deadline := time.Now().Add(*duration)
	var wg sync.WaitGroup
	for range *connections {
		client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2: true,
			MaxConnsPerHost:   1,
		}}
		for range *requests / *connections {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					if get(client, strings.ReplaceAll(*url, "{random}", random()), tokenOrRandom(*token)) == http.StatusTooManyRequests {
						busy.Add(1)
					}
					made.Add(1)
				}
			})
		}
	}
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(Result{Requests: made.Load(), Busy: busy.Load()})
}

// Result is what the flooder prints at the end.
type Result struct {
	Requests int64 `json:"requests"` // requests made
	Busy     int64 `json:"busy"`     // of which answered 429
}

// get GETs url with token and returns the status code, 0 if there was no answer.
func get(c *http.Client, url, token string) int {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// tokenOrRandom is token, or a fresh random one when it is empty.
func tokenOrRandom(token string) string {
	if token != "" {
		return token
	}
	return random() + random()
}

// random is 12 random hex characters.
func random() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
