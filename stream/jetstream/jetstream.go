package jetstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/utils/lru"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

// Transport publishes each delivery to a NATS JetStream stream, on its object's
// subject, and returns once the stream has acknowledged it. Every publish carries the event id
// as Nats-Msg-Id, so the stream's duplicate window drops a redelivery, and the sequence the
// subject's last message is expected to have, so the stream refuses a publish made on a stale
// view of the subject: a deposed leader's late publish, a replica's older version after its
// successor published a newer one. Order on a subject then holds whatever the fence does.
//
// It connects when it is first asked to send, and Close disconnects it: a replica that does
// not lead holds no connection.
type Transport struct {
	cfg     *config.JetStream
	cluster object.Cluster
	log     *slog.Logger
	fence   delivery.Fence

	mu     sync.Mutex
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream // the stream holding the subjects, once known
	// last is, for at most knownSubjects subjects of objects that exist, the subject's last
	// sequence as this transport knows it, from its own acknowledged publishes; a subject not
	// in it is read from the stream.
	last *lru.Cache
}

// knownSubjects bounds how many subjects' last sequences a transport keeps (about 150 bytes
// each): a subject past it costs one read of the stream at its next publish.
const knownSubjects = 65536

// New builds the transport of a JetStream sink, whose connections write nothing once f has
// lapsed; it connects at its first Send.
func New(cfg *config.JetStream, cluster object.Cluster, log *slog.Logger, f delivery.Fence) *Transport {
	if cfg.TLS.InsecureSkipVerify {
		log.Warn("TLS certificate verification is off for this sink")
	}
	return &Transport{cfg: cfg, cluster: cluster, log: log, fence: f, last: lru.New(knownSubjects)}
}

// Close implements transport.
func (t *Transport) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nc != nil {
		t.nc.Close()
	}
	t.nc, t.js, t.stream = nil, nil, nil
	t.last.Clear()
}

// connect returns the connection's JetStream context, connecting first if need be. A server
// that cannot be reached does not fail it: the connection keeps trying in the background and
// publishes fail until it succeeds.
func (t *Transport) connect() (jetstream.JetStream, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.js != nil {
		return t.js, nil
	}
	opts, err := t.options()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(strings.Join(t.cfg.Servers, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("JetStream: %w", err)
	}
	t.nc, t.js = nc, js
	return js, nil
}

func (t *Transport) options() ([]nats.Option, error) {
	c := t.cfg
	opts := []nats.Option{
		nats.Name("dynwatch/" + c.Name),
		nats.Timeout(c.Timeout),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		// Nothing is kept to send after a reconnection: a publish fails at once and is
		// retried as a delivery, with its expected sequence checked again.
		nats.ReconnectBufSize(-1),
		nats.SetCustomDialer(fencedNATSDialer{fence: t.fence, dialer: dialer(c)}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				t.log.Warn("disconnected from NATS", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { t.log.Info("reconnected to NATS", "server", nc.ConnectedUrlRedacted()) }),
	}
	if c.TLSConfig != nil {
		opts = append(opts, nats.Secure(c.TLSConfig.Clone()))
	}
	switch {
	case c.CredentialsFile != "":
		opts = append(opts, nats.UserCredentials(c.CredentialsFile))
	case c.NKeyFile != "":
		o, err := nats.NkeyOptionFromSeed(c.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("nkeyFile: %w", err)
		}
		opts = append(opts, o)
	case c.Login != nil:
		opts = append(opts, nats.UserInfo(string(c.Login.User), string(c.Login.Password)))
	case c.UserFile != "":
		// Read at every connection, so that a rotated password is used without a reload.
		opts = append(opts, nats.UserInfoHandler(func() (string, string) {
			user, err := config.ReadCredential(c.UserFile)
			if err != nil {
				t.log.Warn("read the NATS user file", "err", err)
			}
			password, err := config.ReadCredential(c.PasswordFile)
			if err != nil {
				t.log.Warn("read the NATS password file", "err", err)
			}
			return string(user), string(password)
		}))
	}
	return opts, nil
}

// fencedNATSDialer dials connections that write nothing once the fence has lapsed.
// dialer dials c's servers, those they announce too, within c's egress policy if it has one.
func dialer(c *config.JetStream) *net.Dialer {
	d := &net.Dialer{Timeout: c.Timeout, KeepAlive: 30 * time.Second}
	if c.Egress != nil {
		d.Control = c.Egress.Control
	}
	return d
}

type fencedNATSDialer struct {
	fence  delivery.Fence
	dialer *net.Dialer
}

func (d fencedNATSDialer) Dial(network, address string) (net.Conn, error) {
	c, err := d.dialer.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return delivery.FencedConn(c, d.fence), nil
}

// Send implements delivery.Transport.
func (t *Transport) Send(ctx context.Context, d *delivery.Delivery, body []byte) error {
	if body == nil {
		body = journal.AppendBody(nil, d.Entry)
	}
	js, err := t.connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	subject := Subject(t.cfg.SubjectPrefix, t.keyed(), d)
	msg := message(subject, d, body, t.cluster)
	// A stale expected sequence is read again and the publish made once more, at most twice:
	// more means another publisher writes the subject as fast as this one. An ADDED event is
	// first published expecting an empty subject, without reading it: its object is new, or
	// new to the sink (an initial list, an initialState replay), so its subject usually is,
	// and one round trip is saved; when it is not, the stream refuses the publish and the
	// subject is read as for any other event.
	guess := d.Event.Type == object.Added
	for range 4 {
		seq, err := t.expect(ctx, js, subject, d, guess)
		guess = false
		if errors.Is(err, errDelivered) {
			return nil
		}
		if err != nil {
			return err
		}
		ack, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(t.msgID(d)), jetstream.WithExpectLastSequencePerSubject(seq))
		if err == nil {
			d.Answer = delivery.AnswerAck
			if !ack.Duplicate && d.Event.Type != object.Deleted {
				t.remember(subject, ack.Sequence)
			} else {
				// A duplicate's subject may have moved past the original; a deleted object's
				// subject is read again should the object be created again.
				t.forget(subject)
			}
			return nil
		}
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) {
			if errors.Is(err, nats.ErrMaxPayload) {
				return delivery.Rejected(fmt.Errorf("publish %s: %w (%d bytes)", subject, err, len(body)))
			}
			return fmt.Errorf("publish %s: %w", subject, err)
		}
		d.Answer = delivery.AnswerRefused
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			t.forget(subject)
			continue
		case jetstream.JSErrCodeStreamMessageExceedsMaximum:
			return delivery.Rejected(fmt.Errorf("publish %s: %w (%d bytes)", subject, err, len(body)))
		default:
			return fmt.Errorf("publish %s: %w", subject, err)
		}
	}
	return fmt.Errorf("publish %s: the subject's last sequence changed under every attempt", subject)
}

// message is d as a NATS message on subject: its body, and its CloudEvents attributes as
// headers (the NATS binding's binary mode).
func message(subject string, d *delivery.Delivery, body []byte, c object.Cluster) *nats.Msg {
	msg := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{}}
	for _, a := range delivery.AppendCloudEvent(nil, d, c) {
		msg.Header.Set("ce-"+a.Name, delivery.HeaderString(a.Value))
	}
	msg.Header.Set("ce-datacontenttype", "application/json")
	msg.Header.Set("ce-resourceversion", d.Event.Object.GetResourceVersion())
	return msg
}

// expect returns the sequence subject's last message has, 0 for none. Unless this transport
// published that message, or guess is set (0 is then expected, and the stream checks it), it
// reads it from the stream: when it is d itself, expect returns errDelivered; when it is a
// newer version of d's object, delivery.ErrSuperseded. Either way the stream is found and checked
// first, so that a missing one is named.
func (t *Transport) expect(ctx context.Context, js jetstream.JetStream, subject string, d *delivery.Delivery, guess bool) (uint64, error) {
	if seq, known := t.last.Get(subject); known {
		return seq.(uint64), nil
	}
	stream, err := t.streamFor(ctx, js, subject) // checked once, then kept
	if err != nil || guess {
		return 0, err
	}
	last, err := stream.GetLastMsgForSubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("read the last message of %s: %w", subject, err)
	}
	if last.Header.Get(jetstream.MsgIDHeader) == t.msgID(d) {
		return 0, errDelivered
	}
	if object.Revision(last.Header.Get("ce-resourceversion")) > object.Revision(d.Event.Object.GetResourceVersion()) {
		return 0, delivery.ErrSuperseded
	}
	return last.Sequence, nil
}

// errDelivered is a delivery its subject's last message already is.
var errDelivered = errors.New("already the subject's last message")

// streamFor returns the stream that holds subject: the configured one, checked to exist, or
// the one the server names.
func (t *Transport) streamFor(ctx context.Context, js jetstream.JetStream, subject string) (jetstream.Stream, error) {
	t.mu.Lock()
	s := t.stream
	t.mu.Unlock()
	if s != nil {
		return s, nil
	}
	name := t.cfg.Stream
	if name == "" {
		var err error
		if name, err = js.StreamNameBySubject(ctx, subject); err != nil {
			return nil, fmt.Errorf("find the stream that holds %s: %w", subject, err)
		}
	}
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("stream %s does not exist (dynwatch does not create it)", name)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	if !covers(s.CachedInfo().Config.Subjects, t.cfg.SubjectPrefix) {
		return nil, fmt.Errorf("stream %s does not hold the subjects %s.> (its subjects: %s)", name, t.cfg.SubjectPrefix, strings.Join(s.CachedInfo().Config.Subjects, ", "))
	}
	t.mu.Lock()
	t.stream = s
	t.mu.Unlock()
	return s, nil
}

func (t *Transport) remember(subject string, seq uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.js != nil { // not closed meanwhile
		t.last.Add(subject, seq)
	}
}

func (t *Transport) forget(subject string) { t.last.Remove(subject) }

// covers reports whether one of a stream's subject filters holds every subject under prefix:
// <prefix>.<resource>.<group>.<namespace>.<name>.
func covers(filters []string, prefix string) bool {
	pattern := append(strings.Split(prefix, "."), "*", "*", "*", "*")
	for _, f := range filters {
		tokens := strings.Split(f, ".")
		for i, tok := range tokens {
			if tok == ">" {
				return true
			}
			if i >= len(pattern) || tok != "*" && tok != pattern[i] {
				break
			}
			if i == len(tokens)-1 && len(tokens) == len(pattern) {
				return true
			}
		}
	}
	return false
}

// keyed is the cluster id that subjects carry: empty unless cluster.inKeys.
func (t *Transport) keyed() string {
	if t.cluster.InKeys {
		return t.cluster.ID
	}
	return ""
}

// msgID is d's message id, which the stream deduplicates publishes by (across all its
// subjects): the subject prefix, '/', the cluster's id and '/' with cluster.inKeys, then the
// event id. So two dynwatch installs naming different clusters never drop each other's
// messages as duplicates, even where they watch the same objects; nor do two sinks of one
// install publishing the same event into one stream under different prefixes (each sink's
// events carry the same ids).
func (t *Transport) msgID(d *delivery.Delivery) string {
	if c := t.keyed(); c != "" {
		return t.cfg.SubjectPrefix + "/" + c + "/" + d.ID
	}
	return t.cfg.SubjectPrefix + "/" + d.ID
}

// Subject is the subject a delivery is published to: prefix, then the cluster's id unless it
// is empty (cluster.inKeys false), then the object's resource, group, namespace and name, each
// one token. A token is its value with every byte but ASCII
// letters, digits and '-' written %XX (upper-case hex), so '.' in a group or a name stays
// inside its token; the core group and a cluster-scoped object's namespace are "_", which no
// escaped value can be.
func Subject(prefix, cluster string, d *delivery.Delivery) string {
	gvr := d.Event.Resource
	var b strings.Builder
	b.WriteString(prefix)
	tokens := []string{gvr.Resource, gvr.Group, d.Event.Object.GetNamespace(), d.Event.Object.GetName()}
	if cluster != "" {
		tokens = append([]string{cluster}, tokens...)
	}
	for _, v := range tokens {
		b.WriteByte('.')
		if v == "" {
			b.WriteByte('_')
			continue
		}
		for i := 0; i < len(v); i++ {
			c := v[i]
			if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' {
				b.WriteByte(c)
			} else {
				fmt.Fprintf(&b, "%%%02X", c)
			}
		}
	}
	return b.String()
}
