package delivery

import (
	"context"
	"testing"

	"github.com/dynwatch/dynwatch/journal"
)

// Pipeline is a Dispatcher under test with its journal, built, run and stopped in the order
// app's pipeline keeps, without leader election or informers: events go to Journal.OnEvent.
// The benchmarks of package delivery_test use it too.
type Pipeline struct {
	*Dispatcher
	Journal *journal.Journal
	cancel  context.CancelFunc
	done    chan struct{}
}

// StartPipeline builds a journal, with its state store at statePath (empty: in memory), and a
// Dispatcher over it from o, and runs them until Stop is called or the test ends.
func StartPipeline(t testing.TB, o Options, statePath string) *Pipeline {
	t.Helper()
	p := &Pipeline{done: make(chan struct{})}
	j, err := journal.New(journal.Options{Logger: o.Logger, Registerer: o.Registerer, Path: statePath, Now: o.Now, Workers: 4,
		Targets: func() []journal.Target { return p.Targets() }, Retired: func(t journal.Target) { p.Retire(t) }})
	if err != nil {
		t.Fatal(err)
	}
	o.Journal = j
	d, err := New(o)
	if err != nil {
		_ = j.Close()
		t.Fatal(err)
	}
	p.Dispatcher, p.Journal = d, j
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	writing, stopWriting := context.WithCancel(context.Background())
	written := make(chan struct{})
	go func() { defer close(written); j.Run(writing) }()
	go func() {
		defer close(p.done)
		d.Start(ctx)
		if err := d.Lead(ctx); err != nil {
			t.Error(err)
		}
		<-ctx.Done()
		d.Stop(func() { stopWriting(); <-written })
		_ = j.Flush()
		if err := j.Close(); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(p.Stop)
	return p
}

// Cancel begins the stop; Done is closed once it is over.
func (p *Pipeline) Cancel() { p.cancel() }

// Done is closed once the pipeline has stopped.
func (p *Pipeline) Done() <-chan struct{} { return p.done }

// Stop stops the pipeline and waits until it has.
func (p *Pipeline) Stop() { p.cancel(); <-p.done }
