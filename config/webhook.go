package config

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"

	"cel.dev/cel-go/cel"
	"golang.org/x/net/http/httpguts"
)

// Webhook is one HTTP sink that receives the events its filters select.
type Webhook struct {
	Sink              `mapstructure:",squash"`
	URL               string   `mapstructure:"url"`
	Headers           []Header `mapstructure:"headers"`
	BearerTokenFile   string   `mapstructure:"bearerTokenFile"`
	SigningSecretFile string   `mapstructure:"signingSecretFile"` // Standard Webhooks secret, whsec_...
	// SigningSecretFiles are more Standard Webhooks secrets, each of which signs every request
	// (v1), beside signingSecretFile's: several at once let a secret rotate.
	SigningSecretFiles []string `mapstructure:"signingSecretFiles"`
	// SigningKeyFiles are Ed25519 private keys (PKCS#8 PEM), each of which signs every request
	// with Standard Webhooks' asymmetric scheme (v1a): receivers verify with the public key
	// alone (see /signing-keys), and several at once let a key rotate.
	SigningKeyFiles []string `mapstructure:"signingKeyFiles"`
	TLS             TLS      `mapstructure:"tls"`
	// AllowCredentialsOverHTTP permits a bearer token or signing secret with a plain http://
	// URL to a host other than loopback, where anyone on the path can read or replay them.
	AllowCredentialsOverHTTP bool `mapstructure:"allowCredentialsOverHTTP"`

	// Parsed by Load.
	Endpoint    *url.URL `mapstructure:"-"`
	BearerToken Secret   `mapstructure:"-"`
	// SigningSecrets are the HMAC keys of signingSecretFile and signingSecretFiles, decoded, in
	// that order.
	SigningSecrets []Secret `mapstructure:"-"`
	// SigningKeys are the Ed25519 private keys of signingKeyFiles (ed25519.PrivateKey's 64
	// bytes), in order.
	SigningKeys []Secret    `mapstructure:"-"`
	TLSConfig   *tls.Config `mapstructure:"-" json:"-"` // nil: Go's defaults; never marshalled (it holds funcs)
	// FilesDigest is a digest of the TLS files' contents, so that a reload sees them change.
	FilesDigest [sha256.Size]byte `mapstructure:"-"`
}

// Header is an extra HTTP header sent with every request.
type Header struct {
	Name  string `mapstructure:"name"`
	Value string `mapstructure:"value"`
}

// TLS configures the connection to an https sink.
type TLS struct {
	CAFile             string `mapstructure:"caFile"`
	CertFile           string `mapstructure:"certFile"`
	KeyFile            string `mapstructure:"keyFile"`
	InsecureSkipVerify bool   `mapstructure:"insecureSkipVerify"`
}

// Shared implements SinkConfig.
func (w *Webhook) Shared() *Sink { return &w.Sink }

func (*Webhook) key() string { return "webhooks" }

// Same implements SinkConfig: the same entry in the file and the same secrets read from their
// files.
func (w *Webhook) Same(other SinkConfig) bool {
	o, ok := other.(*Webhook)
	return ok && w.Source == o.Source && bytes.Equal(w.BearerToken, o.BearerToken) && sameSecrets(w.SigningSecrets, o.SigningSecrets) &&
		sameSecrets(w.SigningKeys, o.SigningKeys) && w.FilesDigest == o.FilesDigest
}

func sameSecrets(a, b []Secret) bool {
	return slices.EqualFunc(a, b, func(x, y Secret) bool { return bytes.Equal(x, y) })
}

// SecretFiles implements SinkConfig.
func (w *Webhook) SecretFiles() []string {
	return append(append(nonEmpty(w.BearerTokenFile, w.SigningSecretFile, w.TLS.CAFile, w.TLS.CertFile, w.TLS.KeyFile), w.SigningSecretFiles...), w.SigningKeyFiles...)
}

// ReadSigningSecrets reads the signing secret files of w: signingSecretFile's, then
// signingSecretFiles', in order; the first error names its file.
func (w *Webhook) ReadSigningSecrets() ([]Secret, error) {
	var out []Secret
	for _, f := range append(nonEmpty(w.SigningSecretFile), w.SigningSecretFiles...) {
		s, err := ReadSigningSecret(f)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// ReadSigningKeys reads w's signingKeyFiles, in order; the first error names its file.
func (w *Webhook) ReadSigningKeys() ([]Secret, error) {
	var out []Secret
	for _, f := range w.SigningKeyFiles {
		k, err := ReadSigningKey(f)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, nil
}

// ReadSigningKey reads an Ed25519 private key from a PKCS#8 PEM file ("PRIVATE KEY", as
// openssl genpkey -algorithm ed25519 writes it) and returns ed25519.PrivateKey's 64 bytes.
func ReadSigningKey(path string) (Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseSigningKey(b, path)
}

// ParseSigningKey parses an Ed25519 private key in PKCS#8 PEM, from what name names (a file, a
// Secret's key), and returns ed25519.PrivateKey's 64 bytes. Its errors name name, never the
// content.
func ParseSigningKey(b []byte, name string) (Secret, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s does not hold a PKCS#8 private key in PEM (-----BEGIN PRIVATE KEY-----)", name)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	k, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s holds a %T key; Standard Webhooks' v1a signatures need an Ed25519 key", name, key)
	}
	return Secret(k), nil
}

// nonEmpty returns the paths that are set.
func nonEmpty(paths ...string) []string {
	var out []string
	for _, f := range paths {
		if f != "" {
			out = append(out, f)
		}
	}
	return out
}

// MinSigningSecret is Standard Webhooks' minimum secret length, in bytes.
const MinSigningSecret = 24

// ReadCredential reads a file holding one credential (a bearer token, a user name, a
// password): its content without surrounding white space.
func ReadCredential(path string) (Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	token := Secret(strings.TrimSpace(string(b)))
	if len(token) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	return token, nil
}

// ReadSigningSecret reads a Standard Webhooks secret file (whsec_ followed by base64) and
// returns the key.
func ReadSigningSecret(path string) (Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseSigningSecret(b, path)
}

// ParseSigningSecret parses a Standard Webhooks secret (whsec_ followed by base64) from what
// name names (a file, a Secret's key) and returns the key. Its errors name name, never the
// content.
func ParseSigningSecret(b []byte, name string) (Secret, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(strings.TrimSpace(string(b)), "whsec_"))
	if err != nil || len(key) == 0 {
		return nil, fmt.Errorf("%s does not hold a Standard Webhooks secret (whsec_ followed by base64)", name)
	}
	if len(key) < MinSigningSecret {
		return nil, fmt.Errorf("%s holds a %d-byte key; Standard Webhooks requires at least %d", name, len(key), MinSigningSecret)
	}
	return key, nil
}

// reservedHeaders are set by dynwatch itself.
var reservedHeaders = []string{"content-type", "content-length", "host", "authorization", "webhook-id", "webhook-timestamp", "webhook-signature"}

func (w *Webhook) validate(path string, resources []Resource, env *cel.Env, p *problems) {
	w.Sink.validate(path, resources, env, p)
	w.Endpoint = checkURL(path+".url", w.URL, true, p)
	var err error
	seen := map[string]bool{}
	for j, h := range w.Headers {
		hpath := fmt.Sprintf("%s.headers[%d]", path, j)
		lower := strings.ToLower(h.Name)
		switch {
		case !httpguts.ValidHeaderFieldName(h.Name):
			p.add(hpath+".name", "%q is not a valid header name", h.Name)
		case slices.Contains(reservedHeaders, lower) || strings.HasPrefix(lower, "ce-"):
			p.add(hpath+".name", "%s is set by dynwatch", h.Name)
		case seen[lower]:
			p.add(hpath+".name", "duplicate header %s", h.Name)
		}
		seen[lower] = true
		if !httpguts.ValidHeaderFieldValue(h.Value) {
			p.add(hpath+".value", "is not a valid header value")
		}
	}
	if w.BearerTokenFile != "" {
		if w.BearerToken, err = ReadCredential(w.BearerTokenFile); err != nil {
			p.add(path+".bearerTokenFile", "%v", err)
		}
	}
	for _, f := range []struct {
		field string
		files []string
		read  func(string) (Secret, error)
		into  *[]Secret
	}{
		{"signingSecretFile", nonEmpty(w.SigningSecretFile), ReadSigningSecret, &w.SigningSecrets},
		{"signingSecretFiles", w.SigningSecretFiles, ReadSigningSecret, &w.SigningSecrets},
		{"signingKeyFiles", w.SigningKeyFiles, ReadSigningKey, &w.SigningKeys},
	} {
		for j, file := range f.files {
			fpath := fmt.Sprintf("%s.%s[%d]", path, f.field, j)
			if f.field == "signingSecretFile" {
				fpath = path + ".signingSecretFile"
			}
			s, err := f.read(file)
			if err != nil {
				p.add(fpath, "%v", err)
				continue
			}
			*f.into = append(*f.into, s)
		}
	}
	if (w.BearerTokenFile != "" || w.SigningSecretFile != "" || len(w.SigningSecretFiles) > 0) && w.Endpoint != nil && w.Endpoint.Scheme == "http" &&
		!IsLoopback(net.JoinHostPort(w.Endpoint.Hostname(), "0")) && !w.AllowCredentialsOverHTTP {
		p.add(path+".url", "is plain http to a host other than loopback, and the webhook has a bearer token or signing secret; use https, or set allowCredentialsOverHTTP: true")
	}
	w.TLSConfig = w.TLS.parse(path+".tls", p)
	w.FilesDigest = digestFiles(w.TLS.CAFile, w.TLS.CertFile, w.TLS.KeyFile)
	if w.TLSConfig != nil && w.Endpoint != nil && w.Endpoint.Scheme != "https" {
		p.add(path+".tls", "is set, but url is not https")
	}
}

func checkURL(path, raw string, required bool, p *problems) *url.URL {
	if raw == "" {
		if required {
			p.add(path, "is required")
		}
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.add(path, "must be an http or https URL, got %q", RedactURL(raw))
		return nil
	}
	return u
}

// RedactURL returns raw with its credentials hidden: the user information and the value of
// every query parameter. A URL that does not parse is replaced whole.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "[unparsable URL redacted]"
	}
	return Redacted(u)
}

// Redacted returns u as a string with its user information and query values hidden.
func Redacted(u *url.URL) string {
	c := *u
	if c.User != nil {
		c.User = url.User("redacted")
	}
	if c.RawQuery != "" {
		q := c.Query()
		for k := range q {
			q[k] = []string{"redacted"}
		}
		c.RawQuery = q.Encode()
	}
	return c.String()
}

// digestFiles digests the contents of the named files; missing ones count as empty.
func digestFiles(paths ...string) [sha256.Size]byte {
	h := sha256.New()
	for _, path := range paths {
		b, _ := os.ReadFile(path)
		fmt.Fprintf(h, "%s:%d:", path, len(b))
		h.Write(b)
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// parse builds the TLS client configuration, or nil when nothing is set.
func (t TLS) parse(path string, p *problems) *tls.Config {
	if t == (TLS{}) {
		return nil
	}
	c := &tls.Config{InsecureSkipVerify: t.InsecureSkipVerify, MinVersion: tls.VersionTLS12} //nolint:gosec // the user's explicit choice
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			p.add(path+".caFile", "%v", err)
		} else if c.RootCAs = x509.NewCertPool(); !c.RootCAs.AppendCertsFromPEM(pem) {
			p.add(path+".caFile", "%s holds no PEM certificate", t.CAFile)
		}
	}
	switch {
	case (t.CertFile == "") != (t.KeyFile == ""):
		p.add(path, "certFile and keyFile go together")
	case t.CertFile != "":
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			p.add(path+".certFile", "%v", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c
}
