// Package webhook owns delivery of dynwatch's events to HTTP sinks.
//
// Vocabulary: a Sink is one configured webhook: its filters, its Queue, its workers, its HTTP
// client and its dead-letter target. The Dispatcher is the dynamicinformer.Subscriber that
// hands each event to every Sink whose filters select it. A Delivery is one event queued for
// one sink, with its stable id (the CloudEvents ce-id and Standard Webhooks webhook-id).
//
// Guarantees: deliveries for the same object are made in order, one at a time; different
// objects are delivered in parallel by the sink's workers. A delivery that fails with a
// network error, 408, 429 or 5xx is retried with exponential backoff and jitter, honouring
// Retry-After, until the sink's retry.maxElapsed; any other answer but 2xx is final. What
// cannot be delivered — retries exhausted, rejected, queue full, dynwatch stopping — goes to
// the dead-letter target with its reason and is counted.
//
// Concurrency: OnEvent never blocks and does no I/O: it filters and pushes onto each sink's
// bounded queue. Workers do the sending; each sink has its own queue, workers and HTTP client,
// so a slow sink never delays another, nor the informers.
package webhook
