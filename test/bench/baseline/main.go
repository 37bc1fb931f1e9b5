// Command baseline is the benchmark's B0: the bare client-go dynamic informer anyone could
// write in a few lines — no transform, no indexers, a handler that only notes when each
// update arrived. With -strip it is B1, what a careful client-go user would run: the same
// informer with a transform, set before it starts, that strips what dynwatch strips by
// default (managedFields and kubectl's last-applied annotation). It serves /readyz (200 once
// synced), /events (the arrival time of each resourceVersion) and Go's profiles under
// /debug/pprof/, on 127.0.0.1.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "baseline:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	namespace := flag.String("namespace", "", "namespace to watch")
	resource := flag.String("resource", "configmaps", "core v1 resource to watch")
	strip := flag.Bool("strip", false, "B1: strip managedFields and kubectl's last-applied annotation from every object before it is stored")
	flag.Parse()
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 50, 100
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dynamic.NewForConfigOrDie(cfg), 0, *namespace, nil)
	informer := factory.ForResource(schema.GroupVersionResource{Version: "v1", Resource: *resource}).Informer()
	if *strip {
		if err := informer.SetTransform(stripDefaults); err != nil {
			return err
		}
	}
	var mu sync.Mutex
	arrivals := map[string]int64{} // resourceVersion → unix nanoseconds
	_, err = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			now := time.Now().UnixNano()
			rv := obj.(*unstructured.Unstructured).GetResourceVersion()
			mu.Lock()
			arrivals[rv] = now
			mu.Unlock()
		},
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !informer.HasSynced() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("/events", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		_ = json.NewEncoder(w).Encode(arrivals)
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("listening %s\n", ln.Addr())
	go func() { _ = http.Serve(ln, mux) }()
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
	return nil
}

// lastApplied is the annotation kubectl apply keeps the last applied configuration in. It is
// spelled here rather than taken from dynwatch's dynamicinformer, so that the baseline links
// no dynwatch package and its memory is client-go's alone.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// stripDefaults is B1's transform: it removes what dynwatch strips by default, managedFields
// and the last-applied annotation, and the annotations with it when it was the only one. As
// client-go's TransformFunc asks, it modifies the object in place, is idempotent (a watch-list
// hands its objects to the transform twice), and passes anything that is not an
// *unstructured.Unstructured through unchanged.
func stripDefaults(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	metadata, _ := u.Object["metadata"].(map[string]any)
	delete(metadata, "managedFields")
	if annotations, ok := metadata["annotations"].(map[string]any); ok {
		if _, ok := annotations[lastApplied]; ok {
			delete(annotations, lastApplied)
			if len(annotations) == 0 {
				delete(metadata, "annotations")
			}
		}
	}
	return u, nil
}
