// Package delivery owns delivery of dynwatch's events to its sinks, HTTP webhooks, NATS JetStream
// streams and Kafka topics, alike for every kind: filtering, queues, retries, fences, dead
// letters, payloads and CloudEvents attributes. How one attempt reaches a destination is a
// Transport's (webhook, stream/jetstream, stream/kafka), chosen above this package. What it
// delivers comes from the journal, which alone opens, reads and closes the state store; app
// builds, runs and closes the journal, runs the leader election, and calls Start, Lead, Follow
// and Stop (app/pipeline.go). Delivery sees the election only through the Leadership
// interface it declares, and the informers' cache only through Cache.
//
// Vocabulary: a Sink is one configured sink of any kind: its filters, its Queue, its workers, its
// Transport and its dead-letter target. A Transport makes one attempt to hand a delivery to the
// destination: package webhook POSTs it, signed; stream/jetstream publishes it and waits for
// the stream's acknowledgement, stream/kafka produces it and waits for the cluster's. The
// Dispatcher runs the Sinks: they are the journal's Targets, whose filters it asks and to
// which it hands each entry once the state store holds it. A Delivery is one event queued for
// one sink, with its stable id (the CloudEvents ce-id and Standard Webhooks webhook-id) and its
// ordering key, the object's resource, namespace and name.
//
// Guarantees: deliveries with the same key are made in order, one at a time, so the DELETED of
// an object precedes the ADDED of one re-created under its name; different keys are delivered
// in parallel by the sink's workers. A delivery that fails with a network error, 408, 429 or
// 5xx (for JetStream and Kafka: anything but a message too large) waits in the queue's delay heap for its
// next attempt (exponential backoff with jitter, or Retry-After, never sooner than
// initialBackoff), holding back only its own key, until the deadline its first failure set
// (maxElapsed later, kept across reloads and restarts). A 401 is tried once more if the
// credential files changed; any other answer but 2xx is final. What cannot be delivered is
// dead-lettered with its reason and counted; a dead letter names the event and carries its body
// only on request. With a state store, nothing durable is dead-lettered for lack of memory: the
// queue is a window over the outbox, and what does not fit waits on disk. A commit that fails
// stops delivery of what it carried until a commit succeeds.
//
// Concurrency: the journal's one goroutine queues each committed entry (Queue never blocks);
// workers do the sending; each sink has its own queue, workers and transport, so a slow sink
// never delays another, nor the informers. Update swaps a
// sink's settings and restarts its workers; its queue, outbox and dead letters stay. Under
// leader election a replica delivers only while it leads, and a request is written only while
// the Fence holds: a connection refuses to write once it has lapsed.
package delivery
