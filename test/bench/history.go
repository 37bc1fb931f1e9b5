package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dynwatch/dynwatch/test/runner"
)

// The -history run measures what resources[].history costs and what its reads cost, two
// dynwatch processes side by side on one bed through one storm: both with the chart's default
// configuration (dynwatchConfig with -chart: the resource cluster-wide, one label indexer, no
// webhook, the state store on; the API without authentication, so that both rows of each query
// pair pay the same), one with `history: {retain: 24h, maxBytes: 8Gi}`, the other without.
// After the storm: CPU per update, resident memory (anonymous and file-backed) and live heap,
// on against off; the history's disk per retained version against the object's JSON as the
// API serves it; a first page of 500 at a resourceVersion from before the storm
// (resourceVersionMatch=Exact, from the history) against the same page now; one object's
// revisions.
const (
	// historyPage is the page of the lists at a past and at the present resourceVersion.
	historyPage = 500
	// historyMaxBytes is the history's maxBytes: more than the run writes, so that nothing is
	// dropped.
	historyMaxBytes = 8 << 30
)

// historyRun is one of the two processes.
type historyRun struct {
	name string
	dw   *dwProc
}

// runHistory is the -history run on the bed b.
func runHistory(ctx context.Context, o options, b *bed, start time.Time) error {
	var runs [2]historyRun
	for i, on := range []bool{false, true} {
		dw, err := startHistory(ctx, o, b, on)
		if err != nil {
			return err
		}
		defer dw.stop()
		runs[i] = historyRun{name: map[bool]string{false: "off", true: "on"}[on], dw: dw}
		logf("history %s: synced in %s", runs[i].name, dw.synced.Round(time.Millisecond))
	}
	off, on := runs[0].dw, runs[1].dw
	for _, r := range runs {
		if err := waitSteady(ctx, syncWait, func() float64 { return counter(ctx, r.dw.metrics, "dynwatch_state_commits_total") }); err != nil {
			return fmt.Errorf("history %s: state store commits: %w", r.name, err)
		}
	}
	// The resourceVersion every object had before the storm: the past the history is read at.
	beforeRV := listedAt(ctx, on.url, o)
	if beforeRV == 0 {
		return fmt.Errorf("history on: no resourceVersion before the storm")
	}
	cpuOff0, cpuOn0 := cpuSeconds(off.pid), cpuSeconds(on.pid)
	// With -profile, both are profiled through the storm: the one with history on to the file,
	// the other beside it (-off before the extension), to be compared.
	offProfile := ""
	if o.profile != "" {
		ext := filepath.Ext(o.profile)
		offProfile = strings.TrimSuffix(o.profile, ext) + "-off" + ext
	}
	profiled := startProfile(ctx, on.metrics, max(1, o.updates/o.rate), o.profile)
	profiledOff := startProfile(ctx, off.metrics, max(1, o.updates/o.rate), offProfile)
	written, err := storm(ctx, b.cs, o)
	if err != nil {
		return err
	}
	if err := errors.Join(<-profiled, <-profiledOff); err != nil {
		return err
	}
	last := written[len(written)-1].rv
	for _, r := range runs {
		if err := waitFor(ctx, 2*time.Minute, func() bool { return listedAt(ctx, r.dw.url, o) >= revision(last) }); err != nil {
			return fmt.Errorf("history %s: the cache did not reach the storm's end: %w", r.name, err)
		}
	}
	n := float64(len(written))
	cpuOff, cpuOn := (cpuSeconds(off.pid)-cpuOff0)/n*1e6, (cpuSeconds(on.pid)-cpuOn0)/n*1e6
	// The history writes within linger (200 ms) of a change: what it holds is read once that
	// has passed.
	if err := sleep(ctx, time.Second); err != nil {
		return err
	}
	var st struct {
		History []struct {
			Bytes    int64  `json:"bytes"`
			Versions int    `json:"versions"`
			Floor    uint64 `json:"floor,string"`
		} `json:"history"`
	}
	if err := getJSON(ctx, on.url+"/status", "", &st); err != nil {
		return err
	}
	if len(st.History) != 1 || st.History[0].Versions == 0 {
		return fmt.Errorf("history on: /status holds %+v, not one history", st.History)
	}
	objJSON, err := servedSize(ctx, on.url+"/api/v1/namespaces/"+namespace+"/"+o.resource+"/"+objectName(o.resource, 0))
	if err != nil {
		return err
	}
	h := st.History[0]
	perVersion := float64(h.Bytes) / float64(h.Versions)
	logf("history on: %d versions in %d MB, %.0f bytes each; the object %d bytes; floor %d, before the storm %s",
		h.Versions, h.Bytes>>20, perVersion, objJSON, h.Floor, fmt.Sprint(beforeRV))

	// Memory before the queries: they are made to the process with history on only, and a
	// paged list's snapshot is kept for 5 minutes.
	if o.heapProfile != "" {
		if err := saveURL(ctx, on.metrics+"/debug/pprof/heap?gc=1", o.heapProfile); err != nil {
			return err
		}
	}
	mOff, mOn := residentMemory(off.pid), residentMemory(on.pid)
	hOff, err := readGoMemory(ctx, off.metrics)
	if err != nil {
		return err
	}
	hOn, err := readGoMemory(ctx, on.metrics)
	if err != nil {
		return err
	}
	collection := on.url + "/api/v1/namespaces/" + namespace + "/" + o.resource + fmt.Sprintf("?limit=%d", historyPage)
	c := &http.Client{}
	// Every page of the whole list once, first: the blocks they read are decoded for the first
	// time (the cache of decoded blocks is empty). Then the first page again and again.
	coldPast, err := timePages(ctx, c, collection+"&resourceVersionMatch=Exact&resourceVersion="+fmt.Sprint(beforeRV), collection)
	if err != nil {
		return err
	}
	coldNow, err := timePages(ctx, c, collection, collection)
	if err != nil {
		return err
	}
	past, now, err := timeRequests(ctx, o.queries,
		target{c: c, url: collection + "&resourceVersionMatch=Exact&resourceVersion=" + fmt.Sprint(beforeRV)},
		target{c: c, url: collection})
	if err != nil {
		return err
	}
	if o.queryProfile != "" {
		if err := profileRequests(ctx, on.metrics, o.queryProfile, target{c: c, url: collection + "&resourceVersionMatch=Exact&resourceVersion=" + fmt.Sprint(beforeRV)}); err != nil {
			return err
		}
	}
	revisionsOf := func(i int) string {
		return on.url + "/api/v1/namespaces/" + namespace + "/" + o.resource + "/" + objectName(o.resource, (i*7919)%o.objects) + "/revisions"
	}
	revs, gets, err := timeRequests(ctx, o.queries, target{c: c, url: revisionsOf(1)}, target{c: c, url: strings.TrimSuffix(revisionsOf(1), "/revisions")})
	if err != nil {
		return err
	}
	mb := func(b uint64) float64 { return float64(b) / (1 << 20) }
	if m := residentMemory(on.pid); m.now > 0 {
		logf("history on: resident memory after the queries %.1f MB (anonymous %.1f), before them %.1f", mb(m.now), mb(m.anon), mb(mOn.now))
	}
	always := func(float64) bool { return true }
	rows := []result{
		row("CPU per update, history on against off", "µs", cpuOn, cpuOff, "off", "≤ 1.1x", func(r float64) bool { return r <= 1.1 }),
		row("resident memory after the storm, on against off", "MB", mb(mOn.now), mb(mOff.now), "off", "≤ 1.1x", func(r float64) bool { return r <= 1.1 }),
		row("resident memory after the storm: anonymous (RssAnon)", "MB", mb(mOn.anon), mb(mOff.anon), "off", "", always),
		row("resident memory after the storm: file-backed (RssFile)", "MB", mb(mOn.file), mb(mOff.file), "off", "", always),
		row("peak resident memory (VmHWM), to after the storm", "MB", mb(mOn.peak), mb(mOff.peak), "off", "", always),
		row("live heap after the storm", "MB", mb(hOn.live), mb(hOff.live), "off", "", always),
		row("history disk per retained version, against the object's JSON", "bytes", perVersion, float64(objJSON), "object", "≤ 0.5x", func(r float64) bool { return r <= 0.5 }),
		row(fmt.Sprintf("list of %d at a resourceVersion before the storm (Exact) p99, against now", historyPage), "ms", pct(past, 99), pct(now, 99), "now", "≤ 2x", func(r float64) bool { return r <= 2 }),
		row(fmt.Sprintf("list of %d at a resourceVersion before the storm (Exact) p50, against now", historyPage), "ms", pct(past, 50), pct(now, 50), "now", "", always),
		row(fmt.Sprintf("each page of %d of the whole list once, before the storm (cold) p99, against now", historyPage), "ms", pct(coldPast, 99), pct(coldNow, 99), "now", "", always),
		row(fmt.Sprintf("each page of %d of the whole list once, before the storm (cold) p50, against now", historyPage), "ms", pct(coldPast, 50), pct(coldNow, 50), "now", "", always),
		row("one object's revisions p99, against a get of it", "ms", pct(revs, 99), pct(gets, 99), "get", "≤ 10 ms", func(float64) bool { return pct(revs, 99) <= 10 }),
	}
	title := fmt.Sprintf("history: %d %s, %d updates at %d/s, %d versions retained; %s; %s", o.objects, o.resource, len(written), o.rate, h.Versions, machine(), time.Since(start).Round(time.Second))
	printTable(title, [2]string{"history on", "against"}, rows)
	return saveResults(o, b.objBytes, rows, map[string]any{"history": true, "updates": len(written), "rate": o.rate, "versions": h.Versions, "historyBytes": h.Bytes})
}

// startHistory starts dynwatch with the chart's default configuration, history on or off, a
// state store of its own and the API without authentication, and waits until it has synced.
func startHistory(ctx context.Context, o options, b *bed, on bool) (*dwProc, error) {
	o.chart = true
	name := map[bool]string{false: "off", true: "on"}[on]
	text := dynwatchConfig(o, sinkSet{}, filepath.Join(b.cluster.Dir, "state-history-"+name, "state.db"))
	const indexers, auth = "\n    indexers:\n", "auth: {mode: kubernetes}"
	if strings.Count(text, indexers) != 1 || strings.Count(text, auth) != 1 {
		return nil, fmt.Errorf("the chart's config has no single resource with indexers, or no single auth:\n%s", text)
	}
	text = strings.Replace(text, auth, "auth: {mode: none}", 1)
	if on {
		text = strings.Replace(text, indexers, fmt.Sprintf("\n    history: {retain: 24h, maxBytes: %d}%s", historyMaxBytes, indexers), 1)
	}
	path := filepath.Join(b.cluster.Dir, "bench-dynwatch-history-"+name+".yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return nil, err
	}
	return launch(ctx, runner.Options{Binary: b.dwBin, Config: path, Kubeconfig: b.cluster.Kubeconfig, Env: o.env, Log: io.Discard})
}

// profileRequests writes dynwatch's CPU profile, from base, to path while t's request is made
// over and over for 10 seconds, and what it allocated meanwhile beside it (-allocs before the
// extension). It says how many requests were made.
func profileRequests(ctx context.Context, base, path string, t target) error {
	const seconds = 10
	ext := filepath.Ext(path)
	profiled := startProfile(ctx, base, seconds, path)
	allocs := startAllocProfile(ctx, base, seconds, strings.TrimSuffix(path, ext)+"-allocs"+ext)
	n := 0
	for end := time.Now().Add(seconds * time.Second); time.Now().Before(end); n++ {
		if _, _, err := timeRequests(ctx, 1, t, t); err != nil {
			return err
		}
	}
	logf("profiled %d requests of %s", 2*n, t.url)
	return errors.Join(<-profiled, <-allocs)
}

// timePages lists page by page to the end, first then collection with each continue token, and
// returns each page's latency, sorted.
func timePages(ctx context.Context, c *http.Client, first, collection string) ([]time.Duration, error) {
	var out []time.Duration
	next := ""
	for {
		u := first
		if next != "" {
			u = collection + "&continue=" + next
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		req.Header.Set("Accept", "application/json")
		t0 := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(t0)
		var l struct {
			Metadata struct {
				Continue string `json:"continue"`
			} `json:"metadata"`
		}
		if err == nil {
			err = json.Unmarshal(body, &l)
		}
		if err == nil && resp.StatusCode != http.StatusOK {
			err = errors.New(resp.Status)
		}
		if err != nil {
			return nil, fmt.Errorf("GET %s: %w", u, err)
		}
		out = append(out, took)
		if next = l.Metadata.Continue; next == "" {
			slices.Sort(out)
			return out, nil
		}
	}
}

// listedAt is the resourceVersion of dynwatch's cache at api: that of a list of the bench
// namespace's first object by name. A list of one page: one with more is kept (pinned) for its
// later pages 5 minutes, and with it every object of its snapshot, which the storm replaces.
func listedAt(ctx context.Context, api string, o options) uint64 {
	var l struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := getJSON(ctx, api+"/api/v1/namespaces/"+namespace+"/"+o.resource+"?fieldSelector=metadata.name%3D"+objectName(o.resource, 0), "", &l); err != nil {
		return 0
	}
	return revision(l.Metadata.ResourceVersion)
}

func revision(rv string) uint64 {
	var n uint64
	_, _ = fmt.Sscan(rv, &n)
	return n
}

// servedSize is the size of the JSON dynwatch's API answers url with.
func servedSize(ctx context.Context, url string) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return len(b), err
}
