package config

import (
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"regexp"

	"cel.dev/cel-go/cel"
)

// JetStream is one NATS JetStream sink: each event is published to a subject of its object
// and acknowledged by the stream before its outbox entry goes.
type JetStream struct {
	Sink `mapstructure:",squash"`
	// Servers are the NATS servers' URLs (nats://, tls://), tried in turn.
	Servers []string `mapstructure:"servers"`
	// CredentialsFile is a NATS credentials file (a user JWT and its nkey seed); NKeyFile an
	// nkey seed file; UserFile and PasswordFile a user name and password. At most one of the
	// three. Each is read again when it changes, as a reload does.
	CredentialsFile string `mapstructure:"credentialsFile"`
	NKeyFile        string `mapstructure:"nkeyFile"`
	UserFile        string `mapstructure:"userFile"`
	PasswordFile    string `mapstructure:"passwordFile"`
	// TLS configures the connection: a CA to verify the servers, a client certificate.
	TLS TLS `mapstructure:"tls"`
	// SubjectPrefix begins every subject: <prefix>.<resource>.<group>.<namespace>.<name>.
	SubjectPrefix string `mapstructure:"subjectPrefix"`
	// Stream, when set, is the stream that must hold the subjects: checked to exist and to
	// cover them when the sink starts. dynwatch never creates it.
	Stream string `mapstructure:"stream"`
	// AllowPasswordWithoutTLS permits userFile and passwordFile with servers other than
	// loopback over a connection without TLS, where anyone on the path can read them.
	AllowPasswordWithoutTLS bool `mapstructure:"allowPasswordWithoutTLS"`
	// Durability is what the stream is checked for before its acknowledgement is taken as
	// durable: file storage, replicas and every server syncing each write.
	Durability Durability `mapstructure:"durability"`

	// Login, when set, is the user name and password to connect with, held in memory (a
	// Subscription's): as userFile and passwordFile, which it excludes.
	Login *Login `mapstructure:"-" json:"-"`

	// Parsed by Load.
	TLSConfig *tls.Config `mapstructure:"-" json:"-"` // nil: no TLS unless a server's URL is tls://
	// FilesDigest is a digest of the credential and TLS files' contents, so that a reload sees
	// them change.
	FilesDigest [sha256.Size]byte `mapstructure:"-"`
}

// DefaultSubjectPrefix begins a JetStream sink's subjects unless subjectPrefix says otherwise.
const DefaultSubjectPrefix = "dynwatch"

// Shared implements SinkConfig.
func (js *JetStream) Shared() *Sink { return &js.Sink }

func (*JetStream) key() string { return "jetstream" }

// Same implements SinkConfig.
func (js *JetStream) Same(other SinkConfig) bool {
	o, ok := other.(*JetStream)
	return ok && js.Source == o.Source && js.FilesDigest == o.FilesDigest && js.Login.same(o.Login)
}

// SecretFiles implements SinkConfig.
func (js *JetStream) SecretFiles() []string {
	return nonEmpty(js.CredentialsFile, js.NKeyFile, js.UserFile, js.PasswordFile, js.TLS.CAFile, js.TLS.CertFile, js.TLS.KeyFile)
}

// subjectTokens are one or more subject tokens of the characters every NATS client accepts,
// joined by dots: no wildcards, no white space, no empty token.
var subjectTokens = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

// streamName is what NATS accepts as a stream's name, and more: it is a subject token, too.
var streamName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,255}$`)

func (js *JetStream) validate(path string, resources []Resource, env *cel.Env, p *problems) {
	js.Sink.validate(path, resources, env, p)
	if len(js.Servers) == 0 {
		p.add(path+".servers", "is required: at least one nats:// or tls:// URL")
	}
	plain := false
	for i, raw := range js.Servers {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "tls") {
			p.add(fmt.Sprintf("%s.servers[%d]", path, i), "must be a nats:// or tls:// URL, got %q", RedactURL(raw))
			continue
		}
		if u.User != nil {
			p.add(fmt.Sprintf("%s.servers[%d]", path, i), "must not carry credentials; use credentialsFile, nkeyFile or userFile and passwordFile")
		}
		if u.Scheme == "nats" && !IsLoopback(net.JoinHostPort(u.Hostname(), "0")) {
			plain = true
		}
	}
	set := 0
	for _, f := range []string{js.CredentialsFile, js.NKeyFile, js.UserFile + js.PasswordFile} {
		if f != "" {
			set++
		}
	}
	if js.Login != nil {
		set++
	}
	if set > 1 {
		p.add(path, "credentialsFile, nkeyFile and userFile with passwordFile exclude each other")
	}
	if (js.UserFile == "") != (js.PasswordFile == "") {
		p.add(path, "userFile and passwordFile go together")
	}
	for field, f := range map[string]string{"credentialsFile": js.CredentialsFile, "nkeyFile": js.NKeyFile, "userFile": js.UserFile, "passwordFile": js.PasswordFile} {
		if f != "" {
			checkNotEmpty(path+"."+field, f, p)
		}
	}
	js.TLSConfig = js.TLS.parse(path+".tls", p)
	if (js.PasswordFile != "" || js.Login != nil) && plain && js.TLSConfig == nil && !js.AllowPasswordWithoutTLS {
		p.add(path+".servers", "include a nats:// server other than loopback, without tls, and the sink has a password; use tls:// or set tls, or set allowPasswordWithoutTLS: true")
	}
	if !subjectTokens.MatchString(js.SubjectPrefix) {
		p.add(path+".subjectPrefix", "must be subject tokens of letters, digits, - and _ joined by dots, got %q", js.SubjectPrefix)
	}
	if js.Stream != "" && !streamName.MatchString(js.Stream) {
		p.add(path+".stream", "must be letters, digits, - and _, got %q", js.Stream)
	}
	js.Durability.validate(path+".durability", true, p)
	js.FilesDigest = digestFiles(js.SecretFiles()...)
}

// checkNotEmpty adds a problem unless path names a readable file that holds more than white
// space.
func checkNotEmpty(field, path string, p *problems) {
	if _, err := ReadCredential(path); err != nil {
		p.add(field, "%v", err)
	}
}
