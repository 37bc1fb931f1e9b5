// Package subscription runs the sinks teams declare themselves: Subscription objects
// (events.dynwatch.io/v1alpha1), each a webhook delivered under its subject's own RBAC.
//
// Vocabulary. A subscription's subject is the user who last wrote its spec, as the chart's
// MutatingAdmissionPolicy records it in spec.subject (and its ValidatingAdmissionPolicy
// checks): a user cannot subscribe as anyone else. A decision is whether a subject may watch a
// resource in a namespace (or cluster-wide), as a SubjectAccessReview answers it.
//
// What it owns. The Controller watches Subscriptions, turns each into a webhook sink
// (config.Webhook with its Subject), hands the set to its caller (Options.Apply) and writes
// each one's status: the conditions Accepted, Authorized and Ready. The Reviewer is the
// delivery.Access of those sinks: it answers each decision from its cache and asks every
// decision in use again every reviewEvery, so that a revoked grant stops deliveries within
// one period; a decision it has never asked is asked on the spot, once for all the callers
// that need it.
//
// Concurrency. Controller.Run and Reviewer.Run each run one goroutine until their context
// ends; Reviewer.Allowed is safe from any goroutine.
package subscription
