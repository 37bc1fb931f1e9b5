package config

import (
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"

	"cel.dev/cel-go/cel"
)

// Kafka is one Kafka sink: each event is produced to a topic as a record keyed by its object's
// ordering key, by an idempotent producer with acks=all, and acknowledged by the cluster
// before its outbox entry goes.
type Kafka struct {
	Sink `mapstructure:",squash"`
	// Brokers are the seed brokers, host:port.
	Brokers []string `mapstructure:"brokers"`
	// Topic receives every event of the sink. dynwatch never creates it.
	Topic string `mapstructure:"topic"`
	// SASL authenticates the connections.
	SASL SASL `mapstructure:"sasl"`
	// TLS configures the connections: on with enabled or any of its files.
	TLS KafkaTLS `mapstructure:"tls"`
	// Compression is the codec of the record batches: none, gzip, snappy, lz4 or zstd.
	Compression Compression `mapstructure:"compression"`
	// Acks must be all: an idempotent producer needs every in-sync replica's acknowledgement.
	// It is a setting only so that a configuration asking for less is refused with a reason.
	Acks string `mapstructure:"acks"`
	// Idempotent must be true (the default), for the same reason.
	Idempotent *bool `mapstructure:"idempotent"`
	// AllowPasswordWithoutTLS permits SASL PLAIN, which sends the password as it is, to brokers
	// other than loopback without TLS.
	AllowPasswordWithoutTLS bool `mapstructure:"allowPasswordWithoutTLS"`
	// Durability is what the topic is checked for before an acknowledgement is taken as
	// durable: its replication factor and min.insync.replicas.
	Durability Durability `mapstructure:"durability"`

	// Parsed by Load.
	TLSConfig *tls.Config `mapstructure:"-" json:"-"` // nil: no TLS
	// FilesDigest is a digest of the credential and TLS files' contents, so that a reload sees
	// them change.
	FilesDigest [sha256.Size]byte `mapstructure:"-"`
}

// SASL is a Kafka sink's authentication: a mechanism, and files holding the user name and the
// password, read again at every connection.
type SASL struct {
	Mechanism    SASLMechanism `mapstructure:"mechanism"`
	UserFile     string        `mapstructure:"userFile"`
	PasswordFile string        `mapstructure:"passwordFile"`
	// Login, when set, is the user name and password held in memory (a Subscription's),
	// instead of userFile and passwordFile.
	Login *Login `mapstructure:"-" json:"-"`
}

// SASLMechanism is a SASL mechanism a Kafka sink can authenticate with.
type SASLMechanism string

// The SASL mechanisms.
const (
	SASLPlain       SASLMechanism = "PLAIN"
	SASLScramSHA256 SASLMechanism = "SCRAM-SHA-256"
	SASLScramSHA512 SASLMechanism = "SCRAM-SHA-512"
)

// KafkaTLS is TLS to the brokers: Enabled with the system's roots, or with the files of TLS.
type KafkaTLS struct {
	Enabled bool `mapstructure:"enabled"`
	TLS     `mapstructure:",squash"`
}

// Compression is a Kafka sink's batch codec.
type Compression string

// The codecs.
const (
	CompressionNone   Compression = "none"
	CompressionGzip   Compression = "gzip"
	CompressionSnappy Compression = "snappy"
	CompressionLZ4    Compression = "lz4"
	CompressionZstd   Compression = "zstd"
)

// AcksAll is the only acks a Kafka sink accepts.
const AcksAll = "all"

// Shared implements SinkConfig.
func (k *Kafka) Shared() *Sink { return &k.Sink }

func (*Kafka) key() string { return "kafka" }

// Same implements SinkConfig.
func (k *Kafka) Same(other SinkConfig) bool {
	o, ok := other.(*Kafka)
	return ok && k.Source == o.Source && k.FilesDigest == o.FilesDigest && k.SASL.Login.same(o.SASL.Login)
}

// SecretFiles implements SinkConfig.
func (k *Kafka) SecretFiles() []string {
	return nonEmpty(k.SASL.UserFile, k.SASL.PasswordFile, k.TLS.CAFile, k.TLS.CertFile, k.TLS.KeyFile)
}

// topicName is what Kafka accepts as a topic's name.
var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

func (k *Kafka) validate(path string, resources []Resource, env *cel.Env, p *problems) {
	k.Sink.validate(path, resources, env, p)
	if len(k.Brokers) == 0 {
		p.add(path+".brokers", "is required: at least one host:port")
	}
	remote := false
	for i, b := range k.Brokers {
		host, port, err := net.SplitHostPort(b)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			p.add(fmt.Sprintf("%s.brokers[%d]", path, i), "must be host:port, got %q", RedactURL(b))
			continue
		}
		if !IsLoopback(b) {
			remote = true
		}
	}
	switch {
	case k.Topic == "":
		p.add(path+".topic", "is required")
	case !topicName.MatchString(k.Topic) || k.Topic == "." || k.Topic == "..":
		p.add(path+".topic", "must be 1 to 249 letters, digits, '.', '_' and '-', and not . or .., got %q", k.Topic)
	}
	k.SASL.validate(path+".sasl", p)
	k.TLSConfig = k.TLS.parse(path+".tls", p)
	if k.TLSConfig == nil && k.TLS.Enabled {
		k.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if k.SASL.Mechanism == SASLPlain && remote && k.TLSConfig == nil && !k.AllowPasswordWithoutTLS {
		p.add(path+".sasl.mechanism", "is PLAIN, which sends the password as it is, to brokers other than loopback without tls; set tls, use a SCRAM mechanism, or set allowPasswordWithoutTLS: true")
	}
	if !slices.Contains([]Compression{CompressionNone, CompressionGzip, CompressionSnappy, CompressionLZ4, CompressionZstd}, k.Compression) {
		p.add(path+".compression", "must be none, gzip, snappy, lz4 or zstd, got %q", k.Compression)
	}
	if k.Acks != AcksAll && k.Acks != "-1" {
		p.add(path+".acks", "must be all, got %q: dynwatch always produces idempotently, so that a retried write is stored once and in order, which needs every in-sync replica's acknowledgement", k.Acks)
	}
	if !*k.Idempotent {
		p.add(path+".idempotent", "must be true: without it a retried write can be stored twice or out of order")
	}
	k.Durability.validate(path+".durability", false, p)
	k.FilesDigest = digestFiles(k.SecretFiles()...)
}

func (s SASL) validate(path string, p *problems) {
	files := s.UserFile != "" || s.PasswordFile != ""
	switch {
	case s.Mechanism == "" && (files || s.Login != nil):
		p.add(path+".mechanism", "is required with userFile and passwordFile: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
	case s.Mechanism == "":
	case !slices.Contains([]SASLMechanism{SASLPlain, SASLScramSHA256, SASLScramSHA512}, s.Mechanism):
		p.add(path+".mechanism", "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, got %q", s.Mechanism)
	case s.Login != nil && files:
		p.add(path, "userFile and passwordFile exclude a login given otherwise")
	case s.Login == nil && (s.UserFile == "" || s.PasswordFile == ""):
		p.add(path, "userFile and passwordFile are required with a mechanism")
	}
	if s.UserFile != "" {
		checkNotEmpty(path+".userFile", s.UserFile, p)
	}
	if s.PasswordFile != "" {
		checkNotEmpty(path+".passwordFile", s.PasswordFile, p)
	}
}
