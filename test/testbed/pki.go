package testbed

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// clientCA signs client certificates for the apiserver's --client-ca-file.
type clientCA struct {
	certFile string
	cert     *x509.Certificate
	key      crypto.Signer
}

func (ca *clientCA) create(dir string) error {
	cert, key, certPEM, _, err := NewCert(pkix.Name{CommonName: "testbed-client-ca"}, nil, nil, nil)
	if err != nil {
		return err
	}
	ca.certFile, ca.cert, ca.key = filepath.Join(dir, "client-ca.crt"), cert, key
	return os.WriteFile(ca.certFile, certPEM, 0o644)
}

func (ca *clientCA) issue(dir, user string, groups []string) (string, string, error) {
	_, _, certPEM, keyPEM, err := NewCert(pkix.Name{CommonName: user, Organization: groups}, nil, ca.cert, ca.key)
	if err != nil {
		return "", "", err
	}
	// A directory of its own for each pair: tests issue the same user's certificate in
	// parallel, and a pair written over another while a client loads it mismatches.
	own, err := os.MkdirTemp(dir, "client-"+user+"-")
	if err != nil {
		return "", "", err
	}
	return writePair(own, "client-"+user, certPEM, keyPEM)
}

// NewCert creates a key and a certificate for subject, valid for a day: a CA when parent is
// nil, otherwise signed by parent (a serving certificate for hosts when there are any, else a
// client certificate). It returns both parsed and PEM-encoded.
func NewCert(subject pkix.Name, hosts []string, parent *x509.Certificate, parentKey crypto.Signer) (*x509.Certificate, crypto.Signer, []byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: subject,
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	switch {
	case parent == nil:
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
		parent, parentKey = tmpl, key
	case len(hosts) > 0:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	default:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("sign certificate for %s: %w", subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

func writePair(dir, name string, certPEM, keyPEM []byte) (string, string, error) {
	certFile, keyFile := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return "", "", err
	}
	return certFile, keyFile, os.WriteFile(keyFile, keyPEM, 0o600)
}
