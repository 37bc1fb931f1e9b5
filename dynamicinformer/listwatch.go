package dynamicinformer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// health is whether an informer's calls to the apiserver succeed: since when they have failed,
// and with what, or zero since the last success.
type health struct {
	mu      sync.Mutex
	since   time.Time
	lastErr string
}

func (h *health) observe(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil:
		h.since, h.lastErr = time.Time{}, ""
	case h.since.IsZero():
		h.since, h.lastErr = time.Now(), err.Error()
	default:
		h.lastErr = err.Error()
	}
}

// failing returns how long calls have failed and the last error, or zero.
func (h *health) failing(now time.Time) (time.Duration, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.since.IsZero() {
		return 0, ""
	}
	return now.Sub(h.since), h.lastErr
}

// errListEnded is a watch-list stream that ended before its initial events did. client-go's
// Watch returns such a stream, empty and already closed, rather than an error, when the
// connection to the apiserver fails.
var errListEnded = errors.New("the list's stream ended before its initial events")

// observeList passes on the events of w, a watch-list stream, and reports its outcome to h: a
// success once its initial events have ended, else the error that ended it.
func observeList(ctx context.Context, w watch.Interface, h *health) watch.Interface {
	o := newRelay(w)
	go func() {
		defer close(o.out)
		defer w.Stop()
		listed, err := false, errListEnded
		for e := range w.ResultChan() {
			switch {
			case listed:
			case e.Type == watch.Error:
				err = apierrors.FromObject(e.Object)
			case e.Type == watch.Bookmark:
				if m, aerr := meta.Accessor(e.Object); aerr == nil && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
					listed = true
					h.observe(nil)
				}
			}
			if !o.send(e) {
				return
			}
		}
		if !listed && ctx.Err() == nil {
			h.observe(err)
		}
	}()
	return o
}

// relay is a watch that passes on, from its own goroutine, what it makes of the watch under
// it (in; nil when that goroutine opens and stops the watch itself): that goroutine sends to
// out until stop.
type relay struct {
	in   watch.Interface
	out  chan watch.Event
	stop chan struct{}
	once sync.Once
}

func newRelay(in watch.Interface) *relay {
	return &relay{in: in, out: make(chan watch.Event), stop: make(chan struct{})}
}

func (o *relay) ResultChan() <-chan watch.Event { return o.out }

func (o *relay) Stop() {
	o.once.Do(func() {
		close(o.stop)
		if o.in != nil {
			o.in.Stop()
		}
	})
}

// send passes e on, and reports false once the watch is stopped.
func (o *relay) send(e watch.Event) bool {
	select {
	case o.out <- e:
		return true
	case <-o.stop:
		return false
	}
}

type counter interface{ Inc() }

// listWatch lists and watches the resource in one namespace through client, as client-go's
// dynamic informer does. Every list and watch call's outcome goes to h. With sel, only the
// objects of the namespaces it selects are passed on, and its changes are brought in as they
// happen, listed through src (see selectWatch).
func (r *Resource) listWatch(client objects, src source, tweak func(*metav1.ListOptions), ni namespaceInformer, sel *selection) *cache.ListWatch {
	h, mv := ni.health, ni.moves
	selected := &applied{}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			if o.Continue == "" {
				if err := r.m.waitRoom(ctx); err != nil {
					return nil, err
				}
			}
			if sel != nil && o.Continue == "" {
				// Every page of the list is filtered by the selection as it is at its start.
				cur, err := sel.wait(ctx, selectionWait)
				if err != nil {
					return nil, err
				}
				selected.put(cur)
				mv.selectionApplied(cur.rev, true)
			}
			list, err := client.List(ctx, o)
			if ctx.Err() == nil {
				h.observe(err)
			}
			if err == nil {
				r.dropExcluded(list, sel, selected)
			}
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			if err := r.m.waitRoom(ctx); err != nil {
				return nil, err
			}
			initial := o.SendInitialEvents != nil && *o.SendInitialEvents
			if sel != nil && initial {
				cur, err := sel.wait(ctx, selectionWait)
				if err != nil {
					return nil, err
				}
				selected.put(cur)
				mv.selectionApplied(cur.rev, true)
			}
			w, err := client.Watch(ctx, o)
			switch {
			case err == nil && initial:
				w = observeList(ctx, w, h)
			case ctx.Err() == nil:
				h.observe(err)
			}
			if err == nil && sel != nil {
				opts := metav1.ListOptions{}
				tweak(&opts)
				sw := &selectWatch{relay: newRelay(w), r: r, client: src, opts: opts, sel: sel, state: selected, moves: mv, initial: initial}
				go sw.run(ctx, o.ResourceVersion)
				return r.m.gated(sw, ni.expiry), nil
			}
			if err != nil {
				if !initial && ctx.Err() == nil && !isStatus(err) {
					return nil, unreachable{err}
				}
				return nil, err
			}
			if len(r.cfg.ExcludedGlobs) > 0 {
				w = watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
					o, ok := e.Object.(interface{ GetNamespace() string })
					return e, !ok || e.Type == watch.Bookmark || !r.cfg.Excludes(o.GetNamespace())
				})
			}
			return r.m.gated(w, ni.expiry), nil
		},
	}
}

// unreachable is a watch that could not be opened for want of the apiserver (a connection
// reset, a timeout, a network cut) rather than by its answer. The reflector is told the
// connection was refused, which it waits out and then watches again from where it was. Any
// other error makes it list again, and a list hands the subscribers one change per object in
// place of every version between (see Resource.replace), where the watch, resumed, would
// have brought each.
type unreachable struct{ err error }

func (u unreachable) Error() string { return u.err.Error() }
func (u unreachable) Unwrap() error { return u.err }

// As makes the error a refused connection to the reflector (utilnet.IsConnectionRefused).
func (u unreachable) As(target any) bool {
	if errno, ok := target.(*syscall.Errno); ok {
		*errno = syscall.ECONNREFUSED
		return true
	}
	return false
}

// isStatus reports whether err is the apiserver's answer.
func isStatus(err error) bool {
	var status apierrors.APIStatus
	return errors.As(err, &status)
}

// selectionWait bounds how long a list waits for the namespaces a namespaceSelector selects
// to be listed; past it the list fails, naming why, and the reflector tries again.
const selectionWait = 10 * time.Second

// dropExcluded removes from a list the objects of the namespaces the resource's
// excludeNamespaces globs match (the apiserver has left out the named ones already) and, with
// sel, of the namespaces not in the selection the list started with.
func (r *Resource) dropExcluded(list runtime.Object, sel *selection, selected *applied) {
	if len(r.cfg.ExcludedGlobs) == 0 && sel == nil {
		return
	}
	var names members
	if sel != nil {
		names = selected.get().names
	}
	drop := func(namespace string) bool {
		if _, ok := names[namespace]; sel != nil && !ok {
			return true
		}
		return r.cfg.Excludes(namespace)
	}
	switch list := list.(type) {
	case *unstructured.UnstructuredList:
		list.Items = slices.DeleteFunc(list.Items, func(u unstructured.Unstructured) bool { return drop(u.GetNamespace()) })
	case *wireList:
		list.Items = slices.DeleteFunc(list.Items, func(w *wire) bool { return drop(w.Namespace) })
	}
}

func (r *Resource) onWatchError(ctx context.Context, reflector *cache.Reflector, err error) {
	r.watchErrs.Inc()
	r.mu.Lock()
	r.lastError = err.Error()
	r.mu.Unlock()
	cache.DefaultWatchErrorHandler(ctx, reflector, err)
	if apierrors.IsNotFound(err) {
		// The resource may have gone away (CRD deleted): let discovery decide, now.
		r.m.Nudge()
	}
}
