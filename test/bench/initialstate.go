package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
)

// The -initial-state run measures what a webhook with initialState, added by a reload, costs
// another sink while its replay runs: the target is that the other sink's p99 latency,
// from an update at the apiserver to its receipt, stays within 2x of what it was before the
// reload. As test/e2e's TestASinkAddedByReloadReceivesEveryObjectOnceWhileAnotherKeepsItsLatency
// does, but alone on the machine and side by side in one run:
//
//  1. dynwatch runs with one webhook, "steady", whose filter selects one object, updated every
//     stampInterval; its latency, from the update's request to its receipt, is measured for
//     -before once its outbox is empty.
//  2. The configuration gains a webhook "late" with initialState (the file replaced, then
//     SIGHUP); the steady sink's latency is measured from then until "late" has received every
//     object as ADDED. With -profile, dynwatch's CPU profile is taken for -profile-seconds
//     from the reload.
const (
	// initialStateObjects is the objects replayed unless -objects is given: the issue's.
	initialStateObjects = 10000
	// stampInterval paces the steady sink's updates, as the e2e test does.
	stampInterval = 20 * time.Millisecond
	// warmUp is how long the steady sink receives updates before it is measured.
	warmUp = 3 * time.Second
	// metricsPoll is how often dynwatch's metrics are read while the replay runs.
	metricsPoll = 250 * time.Millisecond
)

// runInitialState is the -initial-state run on the bed b.
func runInitialState(ctx context.Context, o options, b *bed, start time.Time) error {
	steady, late := newReceiver(), newReceiver()
	steadyURL, lateURL := steady.serve(), late.serve()
	defer steady.close()
	defer late.close()
	// The last object in list order, as the e2e test's "stamp": the new sink receives its
	// changes only once the replay has passed it, at the end.
	stamped := objectName(o.resource, o.objects-1)
	sinks := sinkSet{webhooks: []string{fmt.Sprintf(`{name: steady, url: %s, filter: 'object.metadata.name == "%s"'}`, steadyURL, stamped)}}
	dw, err := startDynwatch(ctx, b.dwBin, b.cluster, o, sinks)
	if err != nil {
		return err
	}
	defer dw.stop()
	if err := waitSteady(ctx, 5*time.Minute, func() float64 { return counter(ctx, dw.metrics, "dynwatch_state_commits_total") }); err != nil {
		return fmt.Errorf("the initial list's commits: %w", err)
	}
	logf("dynwatch synced in %s and its initial list committed", dw.synced.Round(time.Millisecond))

	stampCtx, stopStamping := context.WithCancel(ctx)
	defer stopStamping()
	st := &stamper{}
	stamping := make(chan struct{})
	go func() {
		defer close(stamping)
		st.run(stampCtx, b.cs, o.resource, stamped, stampInterval)
	}()
	before, err := steadyAlone(ctx, o, dw)
	if err != nil {
		return err
	}
	sinks.webhooks = append(sinks.webhooks, fmt.Sprintf("{name: late, url: %s, initialState: true, resources: [%s]}", lateURL, o.resource))
	r, err := replay(ctx, o, b, dw, sinks, late)
	if err != nil {
		return err
	}
	stopStamping()
	<-stamping
	if st.err != nil {
		return st.err
	}
	if err := waitFor(ctx, time.Minute, func() bool { return steady.covers(st.writes) }); err != nil {
		return fmt.Errorf("the steady sink has not received every update: %w", err)
	}
	return reportInitialState(o, b, st.writes, steady.arrivals(), before, r, time.Since(start))
}

// reportInitialState prints the -initial-state run's table, of the steady sink's writes and
// their arrivals, and writes it as JSON with -json.
func reportInitialState(o options, b *bed, writes []write, arrivals map[string]int64, before sample, r replayRun, took time.Duration) error {
	between := func(from, to time.Time) []write {
		return slices.DeleteFunc(slices.Clone(writes), func(w write) bool { return w.started.Before(from) || !w.started.Before(to) })
	}
	pre := latencies(between(before.at, r.reload.at), arrivals)
	during := latencies(between(r.reload.at, r.received), arrivals)
	logWorst(between(r.reload.at, r.received), arrivals, r.reload.at, 5)
	build := ""
	if o.race {
		build = " (built with -race)"
	}
	head := fmt.Sprintf("dynwatch%s initialState benchmark: a sink added by a reload replayed %d %s of %d bytes; another sink's object updated every %s, %d updates measured before the reload (%s) and %d during the replay; load average %s at the reload; %s; took %s",
		build, o.objects, o.resource, b.objBytes, stampInterval, len(pre), o.beforeReload, len(during), r.load, machine(), took.Round(time.Second))
	rows := initialStateRows(o, pre, during, before, r)
	printTable(head, [2]string{"replaying", "before"}, rows)
	if o.jsonPath == "" {
		return nil
	}
	out, _ := json.MarshalIndent(map[string]any{
		"machine": machine(), "cbor": !o.json, "race": o.race, "resource": o.resource, "objects": o.objects, "objectBytes": b.objBytes,
		"updatesBefore": len(pre), "updatesDuring": len(during), "loadAverage": r.load, "results": rows,
		// Every latency, so that several runs can be pooled: one run's p99 during the replay is
		// its third-slowest update of about 270.
		"latenciesBeforeMs": millis(pre), "latenciesDuringMs": millis(during),
	}, "", "  ")
	return os.WriteFile(o.jsonPath, out, 0o644)
}

// steadyAlone lets the steady sink's updates flow until its outbox is empty, then for
// -before, and returns dynwatch's counters from when it began measuring them.
func steadyAlone(ctx context.Context, o options, dw *dwProc) (sample, error) {
	warm := time.Now()
	err := waitFor(ctx, time.Minute, func() bool {
		return time.Since(warm) >= warmUp && counter(ctx, dw.metrics, `dynwatch_webhook_outbox_length{sink="steady"}`) == 0
	})
	if err != nil {
		return sample{}, fmt.Errorf("the steady sink's outbox does not empty: %w", err)
	}
	before := measure(ctx, dw)
	return before, sleep(ctx, o.beforeReload)
}

// replayRun is what replay saw.
type replayRun struct {
	reload, after sample // dynwatch's counters at the reload and once the replay was received
	// recorded is when the journal had recorded every page (the sink's metrics, read every
	// metricsPoll, not to load dynwatch); received when the new sink's receiver had every
	// object.
	recorded, received time.Time
	replayed           float64 // dynwatch_webhook_initial_state_objects_total
	added              int     // ADDED the new sink received
	load               string  // the load averages at the reload
}

// replay configures dynwatch with the sinks, one of them late with initialState, and waits
// until late has received every object, profiling dynwatch meanwhile with -profile.
func replay(ctx context.Context, o options, b *bed, dw *dwProc, sinks sinkSet, late *receiver) (replayRun, error) {
	r := replayRun{reload: measure(ctx, dw), load: loadAverage()}
	if err := reload(b, o, dw, sinks); err != nil {
		return r, err
	}
	profiled := startProfile(ctx, dw.metrics, o.profileSeconds, o.profile)
	replayed := func() float64 {
		return counter(ctx, dw.metrics, `dynwatch_webhook_initial_state_objects_total{sink="late"}`)
	}
	var polled time.Time
	err := waitFor(ctx, 5*time.Minute, func() bool {
		now := time.Now()
		if r.recorded.IsZero() && now.Sub(polled) >= metricsPoll {
			polled = now
			if replayed() >= float64(o.objects) && counter(ctx, dw.metrics, `dynwatch_webhook_initial_state_replaying{sink="late"}`) == 0 {
				r.recorded = now
			}
		}
		if r.received.IsZero() && late.addedCount() >= o.objects {
			r.received = now
		}
		return !r.recorded.IsZero() && !r.received.IsZero()
	})
	if err != nil {
		return r, fmt.Errorf("the replay: %.0f objects recorded, %d received of %d: %w", replayed(), late.addedCount(), o.objects, err)
	}
	r.after, r.replayed, r.added = measure(ctx, dw), replayed(), late.addedCount()
	if err := <-profiled; err != nil {
		return r, err
	}
	if o.profile != "" {
		logf("CPU profile of the first %ds after the reload in %s; the replay took %s", o.profileSeconds, o.profile, r.received.Sub(r.reload.at).Round(time.Millisecond))
	}
	return r, nil
}

// reload replaces dynwatch's configuration file with one of the sinks and sends it SIGHUP; it
// does not wait for dynwatch to apply it.
func reload(b *bed, o options, dw *dwProc, sinks sinkSet) error {
	if _, err := writeConfig(b.cluster, o, sinks); err != nil {
		return err
	}
	return dw.rp.Signal(syscall.SIGHUP)
}

// loadAverage is the machine's load averages over 1, 5 and 15 minutes.
func loadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// initialStateRows are the -initial-state run's figures: the steady sink's latency and
// dynwatch's work per second during the replay against before the reload, and the replay's.
func initialStateRows(o options, pre, during []time.Duration, before sample, r replayRun) []result {
	always := func(float64) bool { return true }
	const against = "before the reload"
	rate := func(f func(sample) float64) (float64, float64) {
		return (f(r.after) - f(r.reload)) / r.after.at.Sub(r.reload.at).Seconds(), (f(r.reload) - f(before)) / r.reload.at.Sub(before.at).Seconds()
	}
	cpu, cpuBefore := rate(func(s sample) float64 { return s.cpu })
	commits, commitsBefore := rate(func(s sample) float64 { return s.commits })
	gcs, gcsBefore := rate(func(s sample) float64 { return s.gcs })
	mb := func(b float64) float64 { return b / (1 << 20) }
	took := r.received.Sub(r.reload.at).Seconds()
	return []result{
		row("steady sink update → receipt p50", "ms", pct(during, 50), pct(pre, 50), against, "", always),
		row("steady sink update → receipt p90", "ms", pct(during, 90), pct(pre, 90), against, "", always),
		row("steady sink update → receipt p99", "ms", pct(during, 99), pct(pre, 99), against, "≤ 2x", func(r float64) bool { return r <= 2 }),
		row("steady sink update → receipt max", "ms", pct(during, 100), pct(pre, 100), against, "", always),
		row("dynwatch CPU", "cores", cpu, cpuBefore, against, "", always),
		row("state store commits", "/s", commits, commitsBefore, against, "", always),
		row("GC cycles", "/s", gcs, gcsBefore, against, "", always),
		row("state store size at the end", "MB", mb(r.after.storeBytes), mb(r.reload.storeBytes), against, "", always),
		row("replay: reload → every page recorded", "s", r.recorded.Sub(r.reload.at).Seconds(), 0, "", "", always),
		row("replay: reload → every object received", "s", took, 0, "", "", always),
		row("replay: objects recorded (initial_state_objects_total)", "", r.replayed, 0, "", "", always),
		row("replay: ADDED received by the new sink", "", float64(r.added), 0, "", "", always),
		row("replay: objects received per second", "/s", float64(o.objects)/took, 0, "", "", always),
	}
}

// millis are durations in milliseconds.
func millis(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d.Microseconds()) / 1000
	}
	return out
}

// logWorst logs the n slowest of the writes, each with when it was made after since.
func logWorst(ws []write, arrivals map[string]int64, since time.Time, n int) {
	byLatency := slices.Clone(ws)
	lat := func(w write) time.Duration { return time.Duration(arrivals[w.rv] - w.started.UnixNano()) }
	slices.SortFunc(byLatency, func(a, b write) int { return int(lat(b) - lat(a)) })
	for _, w := range byLatency[:min(n, len(byLatency))] {
		logf("slow during the replay: %s, made %s after the reload", lat(w).Round(time.Millisecond), w.started.Sub(since).Round(time.Millisecond))
	}
}

// sample is dynwatch's counters at one time.
type sample struct {
	at                time.Time
	cpu, commits, gcs float64
	storeBytes        float64
}

func measure(ctx context.Context, dw *dwProc) sample {
	return sample{
		at:         time.Now(),
		cpu:        cpuSeconds(dw.pid),
		commits:    counter(ctx, dw.metrics, "dynwatch_state_commits_total"),
		gcs:        counter(ctx, dw.metrics, "go_gc_duration_seconds_count"),
		storeBytes: counter(ctx, dw.metrics, "dynwatch_state_size_bytes"),
	}
}

// stamper updates one object every interval, noting each update's resourceVersion and when its
// request started: the steady sink's stream. Read writes and err once run has returned.
type stamper struct {
	writes []write
	err    error
}

// run stamps until ctx ends; an update that fails for another reason ends it, in s.err.
func (s *stamper) run(ctx context.Context, cs kubernetes.Interface, resource, name string, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t0 := time.Now()
		rv, err := update(ctx, cs, resource, name, n)
		if err != nil {
			if ctx.Err() == nil {
				s.err = fmt.Errorf("update %s: %w", name, err)
			}
			return
		}
		s.writes = append(s.writes, write{rv: rv, started: t0})
	}
}

// sleep waits for d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
