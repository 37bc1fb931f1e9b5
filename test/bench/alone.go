package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// runAlone measures each watcher's memory alone (-alone): B0, then B1, then dynwatch, one after
// the other on the same objects, each stopped once measured, so that no two are held at once
// (at 100,000 pods B0 and B1 beside the apiserver did not fit in 24 GiB); then dynwatch's
// queries and watches against the apiserver's. There is no storm, which needs B0 beside
// dynwatch. With -baselines=false only dynwatch runs, and its rows have no baseline.
func runAlone(ctx context.Context, o options, b *bed, start time.Time) error {
	var b0, b1 *measured
	if o.baselines {
		bin, err := buildBaseline(ctx, b.cluster)
		if err != nil {
			return err
		}
		m0, err := measureBaseline(ctx, "B0", bin, b.cluster.Kubeconfig, o.resource)
		if err != nil {
			return err
		}
		m1, err := measureBaseline(ctx, "B1", bin, b.cluster.Kubeconfig, o.resource, "-strip")
		if err != nil {
			return err
		}
		b0, b1 = &m0, &m1
	}
	recv := newReceiver()
	defer recv.close()
	dw, dwM, err := startMeasuredDynwatch(ctx, o, b, recv)
	if err != nil {
		return err
	}
	defer dw.stop()
	api, _, err := dw.rp.WaitListening(ctx)
	if err != nil {
		return err
	}
	queries, err := queryRows(ctx, o, b.cluster, api, dw.metrics, b.cluster.Token(reader))
	if err != nil {
		return err
	}
	rows := append(memoryRows(o, dwM, b0, b1), queries...)
	watchers := "B0, B1 and dynwatch one after the other, each stopped once measured"
	if !o.baselines {
		watchers = "dynwatch alone (no baseline)"
	}
	printTable(fmt.Sprintf("dynwatch benchmark, each watcher alone: %d %s of %d bytes; %s; no storm; dynwatch with 3 indexers, one webhook, its API authorizing every request; queries and watches made as %s; apiserver serving %s; %s; took %s",
		o.objects, o.resource, b.objBytes, watchers, reader, served(o), machine(), time.Since(start).Round(time.Second)), [2]string{"dynwatch", "baseline"}, rows)
	return saveResults(o, b.objBytes, rows, map[string]any{"alone": true, "baselines": o.baselines})
}

// served names what the apiserver serves the watchers in the run.
func served(o options) string {
	if o.json {
		return "JSON (CBORServingAndStorage off)"
	}
	return "CBOR to dynwatch (CBORServingAndStorage on), JSON to B0 and B1"
}

// saveResults writes the run's rows as JSON to o.jsonPath, if it is set, with what describes the
// run and the extra fields.
func saveResults(o options, objBytes int, rows []result, extra map[string]any) error {
	if o.jsonPath == "" {
		return nil
	}
	out := map[string]any{
		"machine": machine(), "cbor": !o.json, "chart": o.chart, "resource": o.resource, "small": o.small, "objects": o.objects,
		"objectBytes": objBytes, "apiAuth": "kubernetes", "queriesAs": reader, "results": rows,
	}
	for k, v := range extra {
		out[k] = v
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(o.jsonPath, b, 0o644)
}
