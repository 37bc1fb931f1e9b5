package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynwatch/dynwatch/test/testbed"
)

// The -sinks run measures how many events a second one dynwatch hands each kind of sink, and
// the CPU it spends on each. The targets: JetStream (3 replicas on loopback) at least
// jetStreamRate events/s sustained from one dynwatch, with CPU per event no more than the
// webhook sink's; Kafka (kfake) reported beside them. For each kind in turn, webhook, JetStream,
// then Kafka, on the same objects:
//
//  1. The destination starts: the receiver (main.go) on 127.0.0.1; three nats-server
//     replicas on 127.0.0.1 and the stream DYNWATCH (subjects dw.>, 3 replicas, file storage);
//     or kfake's three brokers, in this process, with the topic events of 12 partitions.
//  2. A Lease is held by someone else, and dynwatch starts under leader election with one sink
//     of the kind (-sink-workers workers, every other setting its default), as the chart runs
//     it (the state store on). Not leading, it delivers nothing: its initial list's ADDED
//     events, one per object, wait in the sink's outbox, as a backlog does after an outage of
//     the sink or in a replica taking over.
//  3. Once dynwatch has synced and the outbox holds every object, the Lease is let go. dynwatch
//     takes it within a retry period and delivers the backlog as fast as the sink takes it:
//     the outbox read back into the queue, the transport, the acknowledgements recorded. The
//     run is timed from the release until dynwatch_webhook_deliveries_total
//     {result="delivered"} (read every deliveredPoll) reaches the objects, with dynwatch's CPU
//     seconds over the same window. The destination must then hold exactly one event per
//     object. With -profile, dynwatch's CPU profile covers the first -profile-seconds.
//  4. dynwatch stops, its state store, the Lease and the checkpoints are removed, and the
//     destination stops.
//
// (An initialState replay, the other way to hand a sink every object, goes at its own pace:
// a page of 100 objects whenever the sink's queue holds less than a page, looked at every 50
// ms, so at most about 2,000 events/s whatever the sink; see webhook/replay.go.)
const (
	// sinksObjects is the objects delivered unless -objects is given: the issue's.
	sinksObjects = 20000
	// jetStreamRate is the target for the JetStream sink, in events/s.
	jetStreamRate = 10000
	// deliveredPoll is how often dynwatch's metrics are read while a sink is delivered to: the
	// resolution of the times measured, not so often that reading them loads dynwatch (a read
	// costs it about 1 ms of CPU: 1% of a 10 s run's).
	deliveredPoll = 100 * time.Millisecond
	// kafkaTopic is the Kafka sink's topic, with its partitions.
	kafkaTopic, kafkaPartitions = "events", 12
	// leaseNamespace holds the Lease and checkpoints of the -sinks run, outside the watched
	// namespace; leaseName names both.
	leaseNamespace, leaseName = "default", "bench-sinks"
)

// destination is where one kind of sink delivers, running until stop.
type destination struct {
	kind  string  // webhook, jetstream or kafka
	sink  string  // the sink's name, in its metrics
	sinks sinkSet // dynwatch's sinks: this one alone
	held  func(ctx context.Context) (int, error)
	// cpu is the CPU seconds the destination has used: the bench's process (the receiver,
	// kfake), and nats-server's.
	cpu  func() float64
	stop func()
}

// benchCPU is the CPU seconds of the bench's own process.
func benchCPU() float64 { return cpuSeconds(os.Getpid()) }

// sinkRun is what one kind's replay measured.
type sinkRun struct {
	Kind string `json:"kind"`
	// Seconds is the time from the Lease's release until every object was delivered;
	// CPUSeconds is dynwatch's CPU time over it.
	Seconds    float64 `json:"seconds"`
	CPUSeconds float64 `json:"cpuSeconds"`
	// DestinationCPUSeconds is the destination's over the same time (see destination.cpu).
	DestinationCPUSeconds float64 `json:"destinationCPUSeconds"`
	// Sustained is the time from 10% of the objects delivered to 90% of them, as polled; 0 if
	// both were first seen at one poll.
	Sustained float64 `json:"sustainedSeconds"`
	Delivered float64 `json:"delivered"` // dynwatch_webhook_deliveries_total{result="delivered"}
	Held      int     `json:"held"`      // events the destination holds
	Load      string  `json:"loadAverage"`
}

// runSinks is the -sinks run on the bed b.
func runSinks(ctx context.Context, o options, b *bed, start time.Time) error {
	load := loadAverage()
	var runs []sinkRun
	for _, begin := range []func(context.Context, options, *bed) (*destination, error){startReceiver, startJetStream, startKafka} {
		d, err := begin(ctx, o, b)
		if err != nil {
			return err
		}
		r, err := runSink(ctx, o, b, d)
		d.stop()
		if err != nil {
			return fmt.Errorf("%s: %w", d.kind, err)
		}
		runs = append(runs, r)
	}
	return reportSinks(o, b, runs, load, time.Since(start))
}

// runSink runs dynwatch with d's sink under a Lease held by another, lets the Lease go once
// the sink's outbox holds every object, measures the delivery of that backlog as sinkRun tells,
// and stops dynwatch and removes its state store, the Lease and the checkpoints.
func runSink(ctx context.Context, o options, b *bed, d *destination) (sinkRun, error) {
	r := sinkRun{Kind: d.kind}
	if err := holdLease(ctx, b.cs); err != nil {
		return r, err
	}
	defer removeElection(b.cs)
	sinks := d.sinks
	sinks.election = fmt.Sprintf("{enabled: true, namespace: %s, leaseName: %s, checkpointName: %s, identity: dynwatch, leaseDuration: 15s, renewDeadline: 10s, retryPeriod: 200ms}",
		leaseNamespace, leaseName, leaseName)
	dw, err := startDynwatch(ctx, b.dwBin, b.cluster, o, sinks)
	if err != nil {
		return r, err
	}
	defer func() {
		dw.stop()
		_ = os.RemoveAll(statePath(b.cluster)) // the next kind starts from no state, as this one did
	}()
	n := float64(o.objects)
	outbox := fmt.Sprintf(`dynwatch_webhook_outbox_length{sink="%s"}`, d.sink)
	if err := waitEvery(ctx, 5*time.Minute, deliveredPoll, func() bool { return counter(ctx, dw.metrics, outbox) >= n }); err != nil {
		return r, fmt.Errorf("%.0f of %d objects in the outbox: %w", counter(ctx, dw.metrics, outbox), o.objects, err)
	}
	logf("%s: dynwatch synced in %s; its outbox holds every object", d.kind, dw.synced.Round(time.Millisecond))
	series := fmt.Sprintf(`dynwatch_webhook_deliveries_total{result="delivered",sink="%s"}`, d.sink)
	delivered := func() float64 { return counter(ctx, dw.metrics, series) }
	var at10, at90 time.Time // when 10% and 90% of the objects were first seen delivered
	r.Load = loadAverage()
	t0, cpu0, dest0 := time.Now(), cpuSeconds(dw.pid), d.cpu()
	if err := releaseLease(ctx, b.cs); err != nil {
		return r, err
	}
	profiled := startProfile(ctx, dw.metrics, o.profileSeconds, fileFor(o.profile, d.kind))
	err = waitEvery(ctx, 5*time.Minute, deliveredPoll, func() bool {
		got, now := delivered(), time.Now()
		if at10.IsZero() && got >= n/10 {
			at10 = now
		}
		if at90.IsZero() && got >= n*9/10 {
			at90 = now
		}
		return got >= n
	})
	r.Seconds, r.CPUSeconds, r.Sustained = time.Since(t0).Seconds(), cpuSeconds(dw.pid)-cpu0, at90.Sub(at10).Seconds()
	r.DestinationCPUSeconds = d.cpu() - dest0
	if err != nil {
		return r, fmt.Errorf("%.0f of %d objects delivered: %w\n%s", delivered(), o.objects, err, strings.Join(problems(dw.rp.Log()), "\n"))
	}
	if err := <-profiled; err != nil {
		return r, err
	}
	r.Delivered = delivered()
	if r.Held, err = d.held(ctx); err != nil {
		return r, fmt.Errorf("count what the destination holds: %w", err)
	}
	logf("%s: %d objects delivered in %.3f s, %.3f CPU seconds, load average %s at the release; the destination holds %d events", d.kind, o.objects, r.Seconds, r.CPUSeconds, r.Load, r.Held)
	if r.Delivered != n || r.Held != o.objects {
		return r, fmt.Errorf("%.0f events delivered and %d held, not one for each of the %d objects", r.Delivered, r.Held, o.objects)
	}
	return r, nil
}

// holdLease makes the run's Lease held by someone else for an hour.
func holdLease(ctx context.Context, cs kubernetes.Interface) error {
	holder, duration, now := "bench", int32(3600), metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leaseName, Namespace: leaseNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &duration, AcquireTime: &now, RenewTime: &now}}
	if _, err := cs.CoordinationV1().Leases(leaseNamespace).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("hold the Lease: %w", err)
	}
	return nil
}

// releaseLease lets the run's Lease go: with no holder, dynwatch takes it at its next try.
func releaseLease(ctx context.Context, cs kubernetes.Interface) error {
	leases := cs.CoordinationV1().Leases(leaseNamespace)
	lease, err := leases.Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("release the Lease: %w", err)
	}
	lease.Spec.HolderIdentity = nil
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("release the Lease: %w", err)
	}
	return nil
}

// removeElection deletes the run's Lease and checkpoints, so that the next kind starts anew.
func removeElection(cs kubernetes.Interface) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = cs.CoordinationV1().Leases(leaseNamespace).Delete(ctx, leaseName, metav1.DeleteOptions{})
	_ = cs.CoreV1().ConfigMaps(leaseNamespace).Delete(ctx, leaseName, metav1.DeleteOptions{})
}

// sinkEntry is the sink name of the kind as a YAML flow mapping: its own settings, then the
// workers every kind is given.
func sinkEntry(o options, name, settings string) string {
	return fmt.Sprintf("{name: %s, %s, workers: %d}", name, settings, o.sinkWorkers)
}

// startReceiver starts the webhook sink's destination: the receiver on 127.0.0.1.
func startReceiver(_ context.Context, o options, _ *bed) (*destination, error) {
	recv := newReceiver()
	url := recv.serve()
	return &destination{
		kind:  "webhook",
		sink:  "hook",
		sinks: sinkSet{webhooks: []string{sinkEntry(o, "hook", "url: "+url)}},
		held:  func(context.Context) (int, error) { return recv.count(), nil },
		cpu:   benchCPU,
		stop:  recv.close,
	}, nil
}

// startJetStream starts the JetStream sink's destination: three nats-server replicas on
// 127.0.0.1 and the stream DYNWATCH of the subjects dw.>, replicated to all three.
func startJetStream(ctx context.Context, o options, b *bed) (*destination, error) {
	dir := filepath.Join(b.cluster.Dir, "nats")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	servers, err := testbed.StartNATS(ctx, b.cluster.Binaries, dir, 3)
	if err != nil {
		return nil, err
	}
	nc, stream, err := createStream(ctx, servers.URLs(), jetstream.StreamConfig{
		Name: "DYNWATCH", Subjects: []string{"dw.>"}, Replicas: 3, Storage: jetstream.FileStorage,
	})
	if err != nil {
		servers.Stop()
		return nil, err
	}
	settings := fmt.Sprintf("servers: [%s], subjectPrefix: dw, stream: DYNWATCH", strings.Join(servers.URLs(), ", "))
	return &destination{
		kind:  "jetstream",
		sink:  "js",
		sinks: sinkSet{jetstream: []string{sinkEntry(o, "js", settings)}},
		held: func(ctx context.Context) (int, error) {
			info, err := stream.Info(ctx)
			if err != nil {
				return 0, err
			}
			return int(info.State.Msgs), nil
		},
		cpu: func() float64 {
			total := benchCPU()
			for _, pid := range servers.PIDs() {
				total += cpuSeconds(pid)
			}
			return total
		},
		stop: func() { nc.Close(); servers.Stop() },
	}, nil
}

// createStream connects to urls and creates the stream, once the servers have elected their
// meta leader; the connection is the caller's to close.
func createStream(ctx context.Context, urls []string, cfg jetstream.StreamConfig) (*nats.Conn, jetstream.Stream, error) {
	nc, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	var stream jetstream.Stream
	var createErr error
	err = waitEvery(ctx, 30*time.Second, 100*time.Millisecond, func() bool {
		stream, createErr = js.CreateStream(ctx, cfg)
		return createErr == nil
	})
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("create stream %s: %w (%w)", cfg.Name, createErr, err)
	}
	return nc, stream, nil
}

// startKafka starts the Kafka sink's destination: kfake's three brokers in this process, on
// 127.0.0.1, with the topic kafkaTopic.
func startKafka(_ context.Context, o options, b *bed) (*destination, error) {
	k, err := testbed.StartKafka(filepath.Join(b.cluster.Dir, "kafka"), 3, []string{fmt.Sprintf("%s:%d", kafkaTopic, kafkaPartitions)})
	if err != nil {
		return nil, err
	}
	settings := fmt.Sprintf("brokers: [%s], topic: %s", strings.Join(k.Brokers(), ", "), kafkaTopic)
	return &destination{
		kind:  "kafka",
		sink:  "kafka",
		sinks: sinkSet{kafka: []string{sinkEntry(o, "kafka", settings)}},
		held: func(ctx context.Context) (int, error) {
			records, err := testbed.ReadTopic(ctx, k.Brokers(), kafkaTopic)
			return len(records), err
		},
		cpu:  benchCPU,
		stop: k.Stop,
	}, nil
}

// reportSinks prints the -sinks run's table and writes it as JSON with -json.
func reportSinks(o options, b *bed, runs []sinkRun, load string, took time.Duration) error {
	build := ""
	if o.race {
		build = " (built with -race)"
	}
	served := "JSON (CBORServingAndStorage off)"
	if !o.json {
		served = "CBOR (CBORServingAndStorage on)"
	}
	head := fmt.Sprintf("dynwatch%s sink throughput benchmark: a backlog of %d %s of %d bytes (the initial list's ADDED events, held in the outbox while another held the Lease) delivered to a sink of each kind once the Lease is let go, one dynwatch per kind (state store on), one after the other; workers: %d, every other setting the default; webhook to a receiver on 127.0.0.1, JetStream to 3 nats-server %s replicas of a stream of 3 replicas (file storage) on 127.0.0.1, Kafka to kfake (3 brokers, %d partitions) in the bench's process; apiserver serving %s; load average %s at the start; %s; took %s",
		build, o.objects, o.resource, b.objBytes, o.sinkWorkers, testbed.NATSServerVersion, kafkaPartitions, served, load, machine(), took.Round(time.Second))
	rows := sinksRows(o, runs)
	printTable(head, [2]string{"sink", "webhook"}, rows)
	if o.jsonPath == "" {
		return nil
	}
	out, _ := json.MarshalIndent(map[string]any{
		"machine": machine(), "cbor": !o.json, "race": o.race, "resource": o.resource, "objects": o.objects, "objectBytes": b.objBytes,
		"workers": o.sinkWorkers, "loadAverage": load, "runs": runs, "results": rows,
	}, "", "  ")
	return os.WriteFile(o.jsonPath, out, 0o644)
}

// sinksRows are the -sinks run's figures, each kind's against the webhook's (runs[0]).
func sinksRows(o options, runs []sinkRun) []result {
	always := func(float64) bool { return true }
	n := float64(o.objects)
	rate := func(r sinkRun) float64 { return n / r.Seconds }
	sustained := func(r sinkRun) float64 {
		if r.Sustained == 0 {
			return 0
		}
		return n * 0.8 / r.Sustained
	}
	perEvent := func(r sinkRun) float64 { return r.CPUSeconds / n * 1e6 }
	destination := func(r sinkRun) float64 { return r.DestinationCPUSeconds / n * 1e6 }
	cores := func(r sinkRun) float64 { return r.CPUSeconds / r.Seconds }
	seconds := func(r sinkRun) float64 { return r.Seconds }
	hook := runs[0]
	var rows []result
	for _, r := range runs {
		against := "webhook"
		if r.Kind == hook.Kind {
			against = ""
		}
		// measure is the row of f's figure, against the webhook's but for the webhook's own.
		measure := func(name, unit string, f func(sinkRun) float64, target string, met func(float64) bool) result {
			base := 0.0
			if against != "" {
				base = f(hook)
			}
			return row(r.Kind+": "+name, unit, f(r), base, against, target, met)
		}
		rateTarget, rateMet, cpuTarget, cpuMet := "", always, "", always
		if r.Kind == "jetstream" {
			rateTarget, rateMet = fmt.Sprintf("≥ %d/s", jetStreamRate), func(float64) bool { return sustained(r) >= jetStreamRate }
			cpuTarget, cpuMet = "≤ 1x", func(ratio float64) bool { return ratio <= 1 }
		}
		rows = append(rows,
			measure("events/s sustained, 10% → 90% delivered", "/s", sustained, rateTarget, rateMet),
			measure("events/s, release → every object delivered", "/s", rate, "", always),
			measure("dynwatch CPU per event", "µs", perEvent, cpuTarget, cpuMet),
			measure("dynwatch CPU", "cores", cores, "", always),
			measure("destination CPU per event (receiver, nats-server x3, kfake)", "µs", destination, "", always),
			measure("release → every object delivered", "s", seconds, "", always),
		)
	}
	return rows
}
