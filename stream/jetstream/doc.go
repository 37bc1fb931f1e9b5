// Package jetstream is the NATS JetStream transport: it publishes each delivery on its object's
// subject (Subject: prefix, resource, namespace, name) with the CloudEvents attributes as
// headers and the event id as Nats-Msg-Id, expecting the subject's last sequence, so that a
// stream holds each object's versions in order even across leaders; a subject that already
// holds the event, or a newer version, is not written again (delivery.ErrSuperseded).
//
// Concurrency: Send is called by a sink's workers at once, for different objects; it connects
// at its first Send, and Close disconnects it.
package jetstream
