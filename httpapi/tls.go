package httpapi

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"os"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	certutil "k8s.io/client-go/util/cert"

	"github.com/dynwatch/dynwatch/config"
)

// TLS serves the query API's certificate: from files, re-read when they change (a Secret's
// symlink swap included), or self-signed at start. With a client CA it asks clients for
// certificates; the authenticator verifies them against the same, equally reloaded, CA.
type TLS struct {
	serving  dynamiccertificates.CertKeyContentProvider
	files    *dynamiccertificates.DynamicCertKeyPairContent // nil when self-signed
	clientCA *dynamiccertificates.DynamicFileCAContent      // nil without api.auth.clientCAFile
	ctrl     *dynamiccertificates.DynamicServingCertificateController
}

// newTLS loads the serving certificate and the client CA named by c, or generates a
// self-signed certificate (written, with its CA, where c.TLS.SelfSignedCAFile says).
func newTLS(log *slog.Logger, c config.API) (*TLS, error) {
	t := &TLS{}
	if c.TLS.CertFile != "" {
		files, err := dynamiccertificates.NewDynamicServingContentFromFiles("api.tls", c.TLS.CertFile, c.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("api.tls: %w", err)
		}
		t.serving, t.files = files, files
	} else {
		serving, err := selfSigned(log, c.Address, c.TLS)
		if err != nil {
			return nil, err
		}
		t.serving = serving
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	var clientCA dynamiccertificates.CAContentProvider
	if c.Auth.ClientCAFile != "" {
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("api.auth.clientCAFile", c.Auth.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("api.auth.clientCAFile: %w", err)
		}
		t.clientCA, clientCA = ca, ca
		// The handshake only asks; the authenticator verifies the chain, as the apiserver does.
		base.ClientAuth = tls.RequestClientCert
	}
	t.ctrl = dynamiccertificates.NewDynamicServingCertificateController(base, clientCA, t.serving, nil, nil)
	if t.files != nil {
		t.files.AddListener(t.ctrl)
	}
	if t.clientCA != nil {
		t.clientCA.AddListener(t.ctrl)
	}
	if err := t.ctrl.RunOnce(); err != nil {
		return nil, fmt.Errorf("api.tls: %w", err)
	}
	return t, nil
}

// ClientCA is the client CA for the authenticator, or nil when client certificates are off.
func (t *TLS) ClientCA() dynamiccertificates.CAContentProvider {
	if t.clientCA == nil {
		return nil
	}
	return t.clientCA
}

// Config is the server's TLS configuration; it always serves the latest certificate.
func (t *TLS) Config() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}, GetConfigForClient: t.ctrl.GetConfigForClient}
}

// Run watches the certificate files until ctx ends.
func (t *TLS) Run(ctx context.Context) error {
	if t.files != nil {
		go t.files.Run(ctx, 1)
	}
	if t.clientCA != nil {
		go t.clientCA.Run(ctx, 1)
	}
	t.ctrl.Run(1, ctx.Done())
	return nil
}

// selfSigned generates a CA and a serving certificate signed by it for loopback, the host
// name, the address's host and the configured hosts. The CA is logged (it is public) and
// written to selfSignedCAFile when set, so clients can trust it.
func selfSigned(log *slog.Logger, address string, c config.ServingTLS) (dynamiccertificates.CertKeyContentProvider, error) {
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	dns := []string{"localhost"}
	hosts := c.SelfSignedHosts
	if host, _, err := net.SplitHostPort(address); err == nil && host != "" {
		hosts = append([]string{host}, hosts...)
	}
	if name, err := os.Hostname(); err == nil {
		hosts = append(hosts, name)
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, h)
		}
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("dynwatch", ips, dns)
	if err != nil {
		return nil, fmt.Errorf("generate a self-signed certificate: %w", err)
	}
	// The first block is the serving certificate, the second its CA.
	_, rest := pem.Decode(certPEM)
	caPEM := rest
	if c.SelfSignedCAFile != "" {
		if err := os.WriteFile(c.SelfSignedCAFile, caPEM, 0o644); err != nil {
			return nil, fmt.Errorf("api.tls.selfSignedCAFile: %w", err)
		}
	}
	log.Warn("api.tls.certFile is not set: serving a self-signed certificate, new at every start; clients must trust this CA",
		"caFile", c.SelfSignedCAFile, "ca", string(caPEM), "dnsNames", dns, "ips", ips)
	return dynamiccertificates.NewStaticCertKeyContent("self-signed", certPEM, keyPEM)
}
