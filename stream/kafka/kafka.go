package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"golang.org/x/time/rate"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/delivery"
	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

// Transport produces each delivery to a Kafka topic as one record keyed by the object's
// ordering key, so that the hash partitioner puts every version of an object in one partition,
// and returns once the cluster has acknowledged it. The producer is idempotent with acks=all
// (the franz-go client's defaults, which the configuration cannot turn off): a write the client
// retries after a lost answer or a broker's failover is stored once, and in order. A delivery is
// sent only once the previous one of its object is acknowledged (the queue's guarantee), so a
// partition holds an object's first arrivals in order. A deposed leader writes nothing: its
// connections refuse to once the fence lapses, and the client, with whatever it still buffers,
// is closed when the replica stops leading.
//
// It connects when it is first asked to send, and Close disconnects it: a replica that does
// not lead holds no connection.
type Transport struct {
	cfg     *config.Kafka
	cluster object.Cluster
	log     *slog.Logger
	fence   delivery.Fence

	mu sync.Mutex
	cl *kgo.Client
	// solo is held for reading by every produce in flight, and for writing by one that must
	// be alone in its batch.
	solo sync.RWMutex
}

// New builds the transport of a Kafka sink, whose connections write nothing once f has lapsed;
// it connects at its first Send.
func New(cfg *config.Kafka, cluster object.Cluster, log *slog.Logger, f delivery.Fence) *Transport {
	if cfg.TLS.InsecureSkipVerify {
		log.Warn("TLS certificate verification is off for this sink")
	}
	return &Transport{cfg: cfg, cluster: cluster, log: log, fence: f}
}

// Close implements transport: records the client still holds are failed, never written.
func (t *Transport) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cl != nil {
		t.cl.Close()
	}
	t.cl = nil
}

// client returns the producer, making it first if need be. It dials the brokers in the
// background: a broker that cannot be reached fails the sends, not this.
func (t *Transport) client() (*kgo.Client, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cl != nil {
		return t.cl, nil
	}
	cl, err := kgo.NewClient(t.options()...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	t.cl = cl
	return cl, nil
}

func (t *Transport) options() []kgo.Opt {
	c := t.cfg
	d := &net.Dialer{Timeout: c.Timeout, KeepAlive: 30 * time.Second}
	if c.Egress != nil {
		d.Control = c.Egress.Control // every broker's connection, those the metadata names too
	}
	dial := delivery.FencedDialer(t.fence, d.DialContext)
	if c.TLSConfig != nil {
		dial = tlsDialer(c.TLSConfig, dial)
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ClientID("dynwatch"),
		kgo.SoftwareNameAndVersion("dynwatch", "1"),
		kgo.Dialer(dial),
		kgo.WithLogger(kgoLogger{log: t.log, every: &rate.Sometimes{Interval: time.Second}}),
		kgo.DefaultProduceTopic(c.Topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// Kafka's own partitioner for keyed records: murmur2 of the key, as the Java producer,
		// so that every client agrees on an object's partition.
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerBatchCompression(codec(c.Compression)),
		// Each delivery waits for its acknowledgement: lingering would only delay it.
		kgo.ProducerLinger(0),
		kgo.ProduceRequestTimeout(c.Timeout),
	}
	if m := t.mechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts
}

// tlsDialer wraps dial with a TLS handshake, so that TLS records go through dial's (fenced)
// connection.
func tlsDialer(cfg *tls.Config, dial delivery.DialFunc) delivery.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := cfg.Clone()
		if c.ServerName == "" {
			c.ServerName, _, _ = net.SplitHostPort(addr)
		}
		conn := tls.Client(raw, c)
		if err := conn.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		return conn, nil
	}
}

// mechanism is the sink's SASL mechanism, nil without one. The user and password files are
// read at every connection, so that rotated credentials are used without a reload.
func (t *Transport) mechanism() sasl.Mechanism {
	s := t.cfg.SASL
	read := func() (string, string, error) {
		if s.Login != nil {
			return string(s.Login.User), string(s.Login.Password), nil
		}
		user, err := config.ReadCredential(s.UserFile)
		if err != nil {
			return "", "", fmt.Errorf("sasl.userFile: %w", err)
		}
		password, err := config.ReadCredential(s.PasswordFile)
		if err != nil {
			return "", "", fmt.Errorf("sasl.passwordFile: %w", err)
		}
		return string(user), string(password), nil
	}
	scramAuth := func(context.Context) (scram.Auth, error) {
		user, password, err := read()
		return scram.Auth{User: user, Pass: password}, err
	}
	switch s.Mechanism {
	case config.SASLPlain:
		return plain.Plain(func(context.Context) (plain.Auth, error) {
			user, password, err := read()
			return plain.Auth{User: user, Pass: password}, err
		})
	case config.SASLScramSHA256:
		return scram.Sha256(scramAuth)
	case config.SASLScramSHA512:
		return scram.Sha512(scramAuth)
	}
	return nil
}

func codec(c config.Compression) kgo.CompressionCodec {
	switch c {
	case config.CompressionGzip:
		return kgo.GzipCompression()
	case config.CompressionSnappy:
		return kgo.SnappyCompression()
	case config.CompressionLZ4:
		return kgo.Lz4Compression()
	case config.CompressionZstd:
		return kgo.ZstdCompression()
	}
	return kgo.NoCompression()
}

// Send implements delivery.Transport. When ctx ends first, the record may still be written by the
// client (an idempotent producer cannot take back a request it sent); the delivery is then made
// again, with the same ce_id, after the one in flight.
//
// A broker refuses a batch over the topic's max.message.bytes whole, failing every record in
// it, so a record refused as too large is produced once more alone before it is rejected.
func (t *Transport) Send(ctx context.Context, d *delivery.Delivery, body []byte) error {
	if body == nil {
		body = journal.AppendBody(nil, d.Entry)
	}
	cl, err := t.client()
	if err != nil {
		return err
	}
	attempt, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	// A record handed back by a failed produce has fields the client set: each produce gets
	// one of its own.
	key := t.key(d)
	record := func() *kgo.Record {
		return &kgo.Record{Key: key, Value: body, Headers: kafkaHeaders(d, key, t.cluster)}
	}
	err = t.produce(attempt, cl, record(), false)
	if errors.Is(err, kerr.MessageTooLarge) {
		err = t.produce(attempt, cl, record(), true)
	}
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		err = t.explain(ctx, cl, err)
	}
	var refused *kerr.Error
	switch {
	case err == nil:
		d.Answer = delivery.AnswerAck
	case errors.As(err, &refused):
		d.Answer = delivery.AnswerRefused
	}
	return t.classify(err, len(body))
}

// explain returns why a produce timed out when the cluster can tell: the client keeps asking
// for a topic that does not exist for longer than timeout. Otherwise it returns err, with why
// the cluster could not be asked (no broker reachable, authentication failing).
func (t *Transport) explain(ctx context.Context, cl *kgo.Client, err error) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	topics, lerr := kadm.NewClient(cl).ListTopics(ctx, t.cfg.Topic)
	if lerr != nil {
		return fmt.Errorf("%w (no broker could say why: %w)", err, lerr)
	}
	if terr := topics[t.cfg.Topic].Err; terr != nil {
		return terr
	}
	return err
}

// produce hands rec to the client and waits for its acknowledgement or the end of ctx. Alone,
// it waits until no other produce of this transport is in flight, and holds the others back
// until it is done, so that its batch holds rec only.
func (t *Transport) produce(ctx context.Context, cl *kgo.Client, rec *kgo.Record, alone bool) error {
	if alone {
		t.solo.Lock()
		defer t.solo.Unlock()
	} else {
		t.solo.RLock()
		defer t.solo.RUnlock()
	}
	done := make(chan error, 1)
	cl.Produce(ctx, rec, func(_ *kgo.Record, err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// classify turns a produce's outcome into send's: a record too large for the topic is
// rejected; everything else may succeed later (a topic created, an ACL granted, a broker back).
func (t *Transport) classify(err error, size int) error {
	topic := t.cfg.Topic
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return delivery.Rejected(fmt.Errorf("produce to %s: %w (%d bytes)", topic, err, size))
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID):
		return fmt.Errorf("topic %s does not exist (dynwatch does not create it): %w", topic, err)
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
		return fmt.Errorf("not allowed to produce to %s: %w", topic, err)
	}
	return fmt.Errorf("produce to %s: %w", topic, err)
}

// key is d's record key: the object's ordering key, after the cluster's id and a '/' with
// cluster.inKeys, so that the same object in two clusters is two keys.
func (t *Transport) key(d *delivery.Delivery) []byte {
	if !t.cluster.InKeys {
		return []byte(d.Key)
	}
	return []byte(t.cluster.ID + "/" + d.Key)
}

// kafkaHeaders are d's CloudEvents attributes as the Kafka protocol binding's binary mode
// carries them: ce_<name> headers holding the values as they are (UTF-8), content-type, and
// partitionkey, the record's key.
func kafkaHeaders(d *delivery.Delivery, key []byte, c object.Cluster) []kgo.RecordHeader {
	attrs := delivery.AppendCloudEvent(nil, d, c)
	h := make([]kgo.RecordHeader, 0, len(attrs)+3)
	for _, a := range attrs {
		h = append(h, kgo.RecordHeader{Key: "ce_" + a.Name, Value: []byte(a.Value)})
	}
	return append(h,
		kgo.RecordHeader{Key: "ce_partitionkey", Value: key},
		kgo.RecordHeader{Key: "ce_resourceversion", Value: []byte(d.Event.Object.GetResourceVersion())},
		kgo.RecordHeader{Key: "content-type", Value: []byte("application/json")})
}

// kgoLogger routes the client's warnings and errors into the sink's log, at most a line a
// second: a broker that is down would otherwise log at every reconnection.
type kgoLogger struct {
	log   *slog.Logger
	every *rate.Sometimes
}

func (kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	l.every.Do(func() {
		args := append([]any{"detail", msg}, keyvals...)
		if level == kgo.LogLevelError {
			l.log.Error("kafka client", args...)
			return
		}
		l.log.Warn("kafka client", args...)
	})
}
