// Package kafka is the Kafka transport: it produces each delivery as one record keyed by its
// object's ordering key (so one object's records keep their order in one partition), with the
// CloudEvents attributes as headers in Kafka's binary mode, and waits for the cluster's
// acknowledgement; a record larger than the topic takes is final (delivery.Rejected).
//
// Concurrency: Send is called by a sink's workers at once, for different objects; it connects
// at its first Send, and Close disconnects it.
package kafka
