package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dynwatch/dynwatch/test/runner"
)

// The -metadata-only run measures what `cache: metadata` saves: the target is that at
// 5,000 configmaps dynwatch's anonymous resident memory is at most 0.35x what the same
// configuration takes with `cache: full`. On one test bed, serving JSON as clusters do by
// default (-json-only is on unless -json-only=false is given):
//
//  1. dynwatch runs with the chart's default configuration (dynwatchConfig with -chart: the
//     resource cluster-wide, one label indexer, no webhook, the state store on) and
//     `cache: full`, until synced and until its state store has stopped committing the
//     initial list; its memory is read then, and again once idle for metadataIdle, after the
//     store's mapped pages have been dropped (journal's releaseEvery, 30 s). Then it stops.
//  2. The same with `cache: metadata`, in a process of its own with a state store of its own.
//
// Each run checks that its cache holds every object, and as what: the metadata run's API must
// answer PartialObjectMetadataList, or the run measured nothing.
const (
	// metadataOnlyObjects is the objects created unless -objects is given: the issue's.
	metadataOnlyObjects = 5000
	// metadataIdle is how long each run stays idle after its state store caught up before its
	// memory is read again: longer than the journal's releaseEvery, so that the store's pages
	// have been dropped from the mapping at least once.
	metadataIdle = 35 * time.Second
	// anonTarget is the target for metadata's anonymous memory against full's.
	anonTarget = 0.35
)

// cacheRun is what one run of dynwatch with one cache setting measured.
type cacheRun struct {
	cache      string
	synced     time.Duration // start → /readyz 200
	peakSynced uint64        // VmHWM at synced
	caughtUp   resident      // once the state store stopped committing the initial list
	heap       goMemory      // the Go heap then, after a forced GC
	idle       resident      // metadataIdle later
	idleHeap   goMemory      // the Go heap then
	objects    int           // objects of the namespace its API lists
	objBytes   int           // the first of them, as its API serves it in JSON
	watchErrs  float64       // its informers' failed lists and watches, to the end
	problems   []string      // the lines it logged at WARN or ERROR
}

// runMetadataOnly is the -metadata-only run on the bed b.
func runMetadataOnly(ctx context.Context, o options, b *bed, start time.Time) error {
	load := loadAverage()
	var runs []cacheRun
	for _, c := range []string{"full", "metadata"} {
		r, err := runCache(ctx, o, b, c)
		if err != nil {
			return fmt.Errorf("cache: %s: %w", c, err)
		}
		runs = append(runs, r)
	}
	full, meta := runs[0], runs[1]
	rows := metadataOnlyRows(o, meta, full)
	served := "JSON (CBORServingAndStorage off)"
	if !o.json {
		served = "CBOR (CBORServingAndStorage on)"
	}
	head := fmt.Sprintf("dynwatch metadata-only benchmark: %d %s of %d bytes; the chart's default config (cluster-wide, 1 indexer, no webhook, state store on) with cache: full, then cache: metadata, one process after the other; apiserver serving %s; load average %s at the start; %s; took %s",
		o.objects, o.resource, b.objBytes, served, load, machine(), time.Since(start).Round(time.Second))
	printTable(head, [2]string{"metadata", "full"}, rows)
	if o.jsonPath == "" {
		return nil
	}
	out, _ := json.MarshalIndent(map[string]any{
		"machine": machine(), "cbor": !o.json, "resource": o.resource, "objects": o.objects, "objectBytes": b.objBytes,
		"loadAverage": load, "idleSeconds": metadataIdle.Seconds(), "results": rows,
		"logged": map[string][]string{"full": full.problems, "metadata": meta.problems},
	}, "", "  ")
	return os.WriteFile(o.jsonPath, out, 0o644)
}

// metadataOnlyRows are the -metadata-only run's figures, metadata against full.
func metadataOnlyRows(o options, meta, full cacheRun) []result {
	always := func(float64) bool { return true }
	const against = "cache: full"
	mb := func(b uint64) float64 { return float64(b) / (1 << 20) }
	perObj := func(b uint64) float64 { return float64(b) / float64(o.objects) / 1024 }
	return []result{
		row("one object as dynwatch's API serves it (JSON)", "bytes", float64(meta.objBytes), float64(full.objBytes), against, "", always),
		row("time to synced", "s", meta.synced.Seconds(), full.synced.Seconds(), against, "", always),
		row("peak resident memory (VmHWM), start → synced", "MB", mb(meta.peakSynced), mb(full.peakSynced), against, "", always),
		row("peak resident memory (VmHWM), start → state store caught up", "MB", mb(meta.caughtUp.peak), mb(full.caughtUp.peak), against, "", always),
		row("resident memory (VmRSS) after sync", "MB", mb(meta.caughtUp.now), mb(full.caughtUp.now), against, "", always),
		row("resident memory after sync: anonymous (RssAnon)", "MB", mb(meta.caughtUp.anon), mb(full.caughtUp.anon), against,
			fmt.Sprintf("≤ %.2fx", anonTarget), func(r float64) bool { return r <= anonTarget }),
		row("resident memory after sync: file-backed (RssFile)", "MB", mb(meta.caughtUp.file), mb(full.caughtUp.file), against, "", always),
		row("live heap after sync and GC", "MB", mb(meta.heap.live), mb(full.heap.live), against, "", always),
		row("live heap after sync per object (the base included)", "KiB", perObj(meta.heap.live), perObj(full.heap.live), against, "", always),
		row("Go heap after sync and GC: free, not returned to the OS", "MB", mb(meta.heap.retained), mb(full.heap.retained), against, "", always),
		row("Go runtime after sync and GC: held from the OS (Sys − HeapReleased)", "MB", mb(meta.heap.held), mb(full.heap.held), against, "", always),
		row(fmt.Sprintf("resident memory (VmRSS) idle %s later", metadataIdle), "MB", mb(meta.idle.now), mb(full.idle.now), against, "", always),
		row("resident memory idle: anonymous (RssAnon)", "MB", mb(meta.idle.anon), mb(full.idle.anon), against, "", always),
		row("resident memory idle: file-backed (RssFile)", "MB", mb(meta.idle.file), mb(full.idle.file), against, "", always),
		row("live heap idle, after GC", "MB", mb(meta.idleHeap.live), mb(full.idleHeap.live), against, "", always),
		row("Go heap idle, after GC: free, not returned to the OS", "MB", mb(meta.idleHeap.retained), mb(full.idleHeap.retained), against, "", always),
		row("informer list and watch errors (dynwatch_informer_watch_errors_total)", "", meta.watchErrs, full.watchErrs, against, "", always),
		row("lines logged at WARN or ERROR", "", float64(len(meta.problems)), float64(len(full.problems)), against, "", always),
	}
}

// runCache runs dynwatch with the chart's default configuration and cache, measures it as
// cacheRun tells, and stops it. With -heap-profile it writes the process's heap profile once
// the state store has caught up, to the file named for the cache (fileFor).
func runCache(ctx context.Context, o options, b *bed, cache string) (cacheRun, error) {
	r := cacheRun{cache: cache}
	dw, err := startCache(ctx, o, b, cache)
	if err != nil {
		return r, err
	}
	defer dw.stop()
	r.synced, r.peakSynced = dw.synced, dw.peak
	if err := waitSteady(ctx, 5*time.Minute, func() float64 { return counter(ctx, dw.metrics, "dynwatch_state_commits_total") }); err != nil {
		return r, fmt.Errorf("state store commits: %w", err)
	}
	caughtUp := time.Now()
	r.caughtUp = residentMemory(dw.pid)
	if r.heap, err = readGoMemory(ctx, dw.metrics); err != nil {
		return r, err
	}
	if o.heapProfile != "" {
		if err := saveURL(ctx, dw.metrics+"/debug/pprof/heap?gc=1", fileFor(o.heapProfile, cache)); err != nil {
			return r, err
		}
	}
	if r.objects, r.objBytes, err = checkCache(ctx, dw.url, b.cluster.Token(reader), o, cache); err != nil {
		return r, err
	}
	logf("cache: %s: synced in %s, live heap %d MB, resident %d MB of which %d MB anonymous and %d MB file-backed (peak %d MB to synced, %d MB to caught up), %d objects cached, %d bytes each as the API serves them",
		cache, r.synced.Round(time.Millisecond), r.heap.live>>20, r.caughtUp.now>>20, r.caughtUp.anon>>20, r.caughtUp.file>>20, r.peakSynced>>20, r.caughtUp.peak>>20, r.objects, r.objBytes)
	if err := sleep(ctx, metadataIdle-time.Since(caughtUp)); err != nil {
		return r, err
	}
	r.idle = residentMemory(dw.pid)
	if r.idleHeap, err = readGoMemory(ctx, dw.metrics); err != nil {
		return r, err
	}
	logf("cache: %s: idle %s later, resident %d MB of which %d MB anonymous and %d MB file-backed, live heap %d MB",
		cache, metadataIdle, r.idle.now>>20, r.idle.anon>>20, r.idle.file>>20, r.idleHeap.live>>20)
	r.watchErrs = sumMetric(ctx, dw.metrics, "dynwatch_informer_watch_errors_total")
	r.problems = problems(dw.rp.Log())
	for _, line := range r.problems[:min(5, len(r.problems))] {
		logf("cache: %s: dynwatch logged: %s", cache, line)
	}
	return r, nil
}

// startCache starts dynwatch with the chart's default configuration and cache, and waits
// until it has synced, timing it from the start, as startDynwatch does with the bench's own
// configurations. Its proc's url is its API.
func startCache(ctx context.Context, o options, b *bed, cache string) (*dwProc, error) {
	cfg, err := writeCacheConfig(b, o, cache)
	if err != nil {
		return nil, err
	}
	return launch(ctx, runner.Options{Binary: b.dwBin, Config: cfg, Kubeconfig: b.cluster.Kubeconfig, Env: o.env})
}

// writeCacheConfig writes the chart's default configuration (dynwatchConfig with -chart) with
// the resource's cache set, and a state store of the cache's own, and returns its path.
func writeCacheConfig(b *bed, o options, cache string) (string, error) {
	o.chart = true
	const indexers = "\n    indexers:\n"
	text := dynwatchConfig(o, sinkSet{}, filepath.Join(b.cluster.Dir, "state-"+cache, "state.db"))
	if strings.Count(text, indexers) != 1 {
		return "", fmt.Errorf("the chart's config has no single resource with indexers to set the cache of:\n%s", text)
	}
	text = strings.Replace(text, indexers, "\n    cache: "+cache+indexers, 1)
	path := filepath.Join(b.cluster.Dir, "bench-dynwatch-"+cache+".yaml")
	return path, os.WriteFile(path, []byte(text), 0o600)
}

// checkCache reads the first page of the bench namespace from dynwatch's API as the token's
// user and returns how many objects it holds and the size of the first in JSON; an error if
// they are fewer than o.objects or not kept as cache says.
func checkCache(ctx context.Context, api, token string, o options, cache string) (int, int, error) {
	var list struct {
		Kind     string `json:"kind"`
		Metadata struct {
			RemainingItemCount int `json:"remainingItemCount"`
		} `json:"metadata"`
		Items []json.RawMessage `json:"items"`
	}
	if err := getJSON(ctx, api+"/api/v1/namespaces/"+namespace+"/"+o.resource+"?limit=1", token, &list); err != nil {
		return 0, 0, err
	}
	n := len(list.Items) + list.Metadata.RemainingItemCount
	if want := "PartialObjectMetadataList"; (cache == "metadata") != (list.Kind == want) {
		return n, 0, fmt.Errorf("dynwatch's API lists a %s with cache: %s", list.Kind, cache)
	}
	if n < o.objects || len(list.Items) == 0 {
		return n, 0, fmt.Errorf("dynwatch's API lists %d of %d objects", n, o.objects)
	}
	return n, len(list.Items[0]), nil
}

// sumMetric is the sum of every series of the metric name in a process's /metrics, 0 if it
// cannot read them.
func sumMetric(ctx context.Context, base, name string) float64 {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	req.Header.Set("Accept-Encoding", "identity") // not compressed: the process measured would pay for it
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		series, value, ok := strings.Cut(sc.Text(), " ")
		if ok && (series == name || strings.HasPrefix(series, name+"{")) {
			v, _ := strconv.ParseFloat(value, 64)
			sum += v
		}
	}
	return sum
}

// problems are the lines of dynwatch's log at level WARN or ERROR.
func problems(log string) []string {
	var out []string
	for line := range strings.SplitSeq(log, "\n") {
		var entry struct{ Level string }
		if json.Unmarshal([]byte(line), &entry) == nil && (entry.Level == "WARN" || entry.Level == "ERROR") {
			out = append(out, line)
		}
	}
	return out
}

// fileFor is the file of one of a mode's runs, a profile of the run with cache full or of the
// JetStream sink: path with "-" and the run's name before its extension (heap.pprof:
// heap-full.pprof and heap-metadata.pprof); "" stays "".
func fileFor(path, run string) string {
	if path == "" {
		return ""
	}
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + "-" + run + ext
}

// goMemory is what the Go runtime of a process holds, after a forced GC: the live heap
// (HeapAlloc), the heap's free spans it has not returned to the OS (HeapIdle − HeapReleased),
// which are still resident and anonymous, and all it holds from the OS, heap, stacks and its
// own structures (Sys − HeapReleased), of which the part touched is resident.
type goMemory struct{ live, retained, held uint64 }

// readGoMemory forces a GC in the process and reads its goMemory from /debug/pprof/heap.
func readGoMemory(ctx context.Context, base string) (goMemory, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/debug/pprof/heap?gc=1&debug=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return goMemory{}, err
	}
	defer resp.Body.Close()
	stats := map[string]uint64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "# "), " = ")
		if v, err := strconv.ParseUint(value, 10, 64); ok && err == nil {
			stats[name] = v
		}
	}
	for _, name := range []string{"HeapAlloc", "HeapIdle", "HeapReleased", "Sys"} {
		if _, ok := stats[name]; !ok {
			return goMemory{}, fmt.Errorf("no %s in %s/debug/pprof/heap", name, base)
		}
	}
	return goMemory{live: stats["HeapAlloc"], retained: stats["HeapIdle"] - stats["HeapReleased"], held: stats["Sys"] - stats["HeapReleased"]}, nil
}
