// Package leader elects the one replica of dynwatch that delivers, fences its deliveries, and
// exchanges the journal's checkpoints between the replicas.
//
// Vocabulary: the Elector takes part in a Lease election (client-go's leaderelection) under
// leaderElection.leaseName. Its fence holds from each successful renewal until that renewal's
// start plus the renew deadline: a replica delivers only while it holds. The checkpoint
// ConfigMap (leaderElection.checkpointName) carries, per sink and resource, the revision
// through which the leader's deliveries are acknowledged; followers trim their outboxes to it.
//
// Guarantees: another replica takes the Lease over no sooner than the lease duration after it
// saw the last renewal, which began after the fence's start; so a leader that is paused,
// partitioned or slow stops delivering at least LeaseDuration - RenewDeadline before another
// can start, provided the replicas' clocks run at about the same rate. Losing or releasing the
// Lease revokes the fence for what starts afterwards; a request already bound ends at the last
// grant's deadline, which no other replica can reach first. A follower acts on the
// ConfigMap's checkpoints only when they name the Lease's holder and term (its annotations)
// and every revision in them is one the cluster has reached (at most what the replica has
// seen, or the resource's list resourceVersion); its floor is then what they say, lower ones
// too. Refused checkpoints trim nothing and are reported: log, metric, the
// CheckpointsAccepted condition in Status.
//
// Concurrency: Run takes part until its context ends and gives the Lease up on the way out.
// Leading, Status, Owns and the fence's methods (Bound, Lapsed, Wait) may be called from any
// goroutine. app runs the Elector with the journal; delivery sees it only through an interface
// of its own (delivery.Leadership), the journal only through journal.Options.Ignore (Owns).
package leader
