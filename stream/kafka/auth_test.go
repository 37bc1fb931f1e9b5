package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/stream/streamtest"
	"github.com/dynwatch/dynwatch/test/testbed"
)

// tlsKafka runs a kfake cluster that speaks TLS only, with a certificate for 127.0.0.1 from a
// CA of its own, and SASL users; it returns the cluster and a client configuration trusting
// the CA.
func tlsKafka(t *testing.T, users ...kfake.Opt) (*testbed.Kafka, *tls.Config) {
	t.Helper()
	ca, caKey, _, _, err := testbed.NewCert(pkix.Name{CommonName: "kafka-ca"}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, certPEM, keyPEM, err := testbed.NewCert(pkix.Name{CommonName: "kafka"}, []string{"127.0.0.1"}, ca, caKey)
	if err != nil {
		t.Fatal(err)
	}
	serving, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]kfake.Opt{kfake.TLS(&tls.Config{Certificates: []tls.Certificate{serving}, MinVersion: tls.VersionTLS12}), kfake.EnableSASL()}, users...)
	k := startKafka(t, []string{"events"}, opts...)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	return k, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
}

func writeSecret(t *testing.T, path, value string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestASinkAuthenticatesOverTLSAndReadsItsPasswordAgainAtEveryConnection(t *testing.T) {
	for _, mechanism := range []config.SASLMechanism{config.SASLPlain, config.SASLScramSHA256, config.SASLScramSHA512} {
		t.Run(string(mechanism), func(t *testing.T) {
			t.Parallel()
			k, tlsConfig := tlsKafka(t, kfake.Superuser(string(mechanism), "dynwatch", "the-right-password"))
			dir := t.TempDir()
			user, password := filepath.Join(dir, "user"), filepath.Join(dir, "password")
			writeSecret(t, user, "dynwatch")
			writeSecret(t, password, "a-wrong-password")
			cfg := &config.Kafka{Sink: config.Sink{Name: "k", Timeout: time.Second}, Brokers: k.Brokers(), Topic: "events", Compression: config.CompressionNone,
				SASL: config.SASL{Mechanism: mechanism, UserFile: user, PasswordFile: password}, TLSConfig: tlsConfig}
			tr := New(cfg, testCluster, slog.New(slog.DiscardHandler), delivery.Always{})
			t.Cleanup(tr.Close)

			err := tr.Send(t.Context(), streamtest.ConfigMapAt("default", "x", "1"), []byte(`{}`))
			if err == nil {
				t.Fatal("a send with the wrong password succeeded")
			}
			if strings.Contains(err.Error(), "a-wrong-password") {
				t.Fatalf("the error shows the password: %v", err)
			}
			writeSecret(t, password, "the-right-password") // rotated, as a Secret's update would
			testbed.Eventually(t, 30*time.Second, func() error {
				return tr.Send(t.Context(), streamtest.ConfigMapAt("default", "x", "2"), []byte(`{}`))
			})
		})
	}
}

func TestASinkWithoutTheClustersCAProducesNothing(t *testing.T) {
	k, _ := tlsKafka(t, kfake.Superuser("PLAIN", "dynwatch", "pw"))
	dir := t.TempDir()
	user, password := filepath.Join(dir, "user"), filepath.Join(dir, "password")
	writeSecret(t, user, "dynwatch")
	writeSecret(t, password, "pw")
	cfg := &config.Kafka{Sink: config.Sink{Name: "k", Timeout: time.Second}, Brokers: k.Brokers(), Topic: "events", Compression: config.CompressionNone,
		SASL: config.SASL{Mechanism: config.SASLPlain, UserFile: user, PasswordFile: password}, TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}}
	tr := New(cfg, testCluster, slog.New(slog.DiscardHandler), delivery.Always{})
	t.Cleanup(tr.Close)
	if err := tr.Send(t.Context(), streamtest.ConfigMapAt("default", "x", "1"), []byte(`{}`)); err == nil {
		t.Fatal("a send to a broker whose certificate the sink cannot verify succeeded")
	}
}
