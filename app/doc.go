// Package app builds every part of dynwatch from its configuration and runs them under one
// errgroup: the informers, the pipeline (pipeline.go: the journal, delivery and, when
// configured, leader election, wired there and nowhere else), the configuration reloader, the
// query API and the metrics server.
//
// Run is the whole service; main only turns flags and signals into Options and a context, and
// the error into an exit code. Run can run in-process: with the servers' addresses set to
// 127.0.0.1:0, a test reads the addresses they bound from the "listening" lines of the log.
//
// Order: the pipeline stops only once the informers have, so no event reaches a journal that
// is closing; the leader gives its Lease up only once delivery has stopped; the journal's
// writer stops after that, so what the informers handed over last is queued, and the journal
// closes last.
//
// Concurrency: Run may be called once per process at a time: it sets process-wide state that
// client-go and klog read (client feature gates, klog's logger, gin's mode) and the Go
// runtime's memory limit (90% of the cgroup's, unless GOMEMLIMIT is set) and GOGC (25, unless
// GOGC is set).
package app
