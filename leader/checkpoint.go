package leader

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

// exchange writes the journal's checkpoints to the checkpoint ConfigMap every interval while
// this replica leads and its fence holds, and while it follows reads them, checks them and
// trims the journal to them.
func (el *Elector) exchange(ctx context.Context, j *journal.Journal) {
	t := time.NewTicker(el.cfg.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var err error
		op, result := "read", "ok"
		if el.Leading() {
			op = "write"
			if tm, held := el.fence.heldFor(); held {
				err = el.publish(ctx, j, tm)
			}
		} else {
			var r *refusal
			if r, err = el.follow(ctx, j); r != nil {
				result = "refused"
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			el.m.checkpoints.WithLabelValues(op, "error").Inc()
			el.log.Warn("checkpoint exchange failed", "operation", op, "configMap", el.configMap(), "err", err)
			continue
		}
		el.m.checkpoints.WithLabelValues(op, result).Inc()
		now := time.Now().UTC()
		el.mu.Lock()
		el.status.Checkpoint = &now
		el.mu.Unlock()
	}
}

// checkpointKey is the ConfigMap's data key holding the checkpoints as JSON:
// {"sink": {"deployments.v1.apps": "1234"}} (see object.ResourceName).
const checkpointKey = "checkpoints.json"

// The ConfigMap's annotations naming the leadership that wrote the checkpoints: the Lease's
// holder and its transition count then.
const (
	holderAnnotation      = "dynwatch.io/lease-holder"
	transitionsAnnotation = "dynwatch.io/lease-transitions"
)

// Why checkpoints read from the ConfigMap are not acted on: the refusals metric's label.
const (
	refusedMalformed      = "malformed"
	refusedNotLeaseHolder = "notLeaseHolder"
	refusedAheadOfCluster = "aheadOfCluster"
)

var refusals = []string{refusedMalformed, refusedNotLeaseHolder, refusedAheadOfCluster}

// refusal is why checkpoints are not acted on, and what exactly is wrong.
type refusal struct{ reason, message string }

// term is one leadership: the Lease's holder and its transition count. No two leaderships
// share one.
type term struct {
	holder      string
	transitions int
}

func (t term) String() string {
	if t.holder == "" {
		return "no one"
	}
	return fmt.Sprintf("%s (transition %d)", t.holder, t.transitions)
}

// writtenBy is the leadership a checkpoint ConfigMap names; none if it names none, as releases
// before the annotations wrote it.
func writtenBy(cm *corev1.ConfigMap) term {
	n, err := strconv.Atoi(cm.Annotations[transitionsAnnotation])
	if err != nil {
		return term{}
	}
	return term{holder: cm.Annotations[holderAnnotation], transitions: n}
}

// leaseTerm reads the Lease's leadership now; none while the Lease does not exist.
func (el *Elector) leaseTerm(ctx context.Context) (term, error) {
	l, err := el.client.CoordinationV1().Leases(el.cfg.Namespace).Get(ctx, el.cfg.LeaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return term{}, nil
	}
	if err != nil {
		return term{}, err
	}
	return term{holder: ptr.Deref(l.Spec.HolderIdentity, ""), transitions: int(ptr.Deref(l.Spec.LeaseTransitions, 0))}, nil
}

// follow reads the checkpoints and, unless it refuses them, trims j to them: the floor is what
// the ConfigMap says now, not the highest it ever said. A refusal is returned, reported and
// trims nothing.
func (el *Elector) follow(ctx context.Context, j *journal.Journal) (*refusal, error) {
	cm, err := el.fetch(ctx)
	if err != nil {
		return nil, err
	}
	if cm == nil {
		el.accepted("NoCheckpoints", "the checkpoint ConfigMap does not exist: nothing is trimmed")
		j.Trim(journal.Checkpoints{})
		return nil, nil
	}
	lease, err := el.leaseTerm(ctx)
	if err != nil {
		return nil, err
	}
	cp, r, err := el.check(ctx, j, cm, lease)
	if err != nil {
		return nil, err
	}
	if r != nil {
		el.refused(*r)
		return r, nil
	}
	el.accepted("Accepted", "the checkpoints are the Lease holder's and within what the cluster has reached")
	j.Trim(cp)
	return nil, nil
}

// check decodes a checkpoint ConfigMap and refuses it unless the leadership lease wrote it and
// every revision in it is one the cluster has reached: at most what j has seen of the resource
// or, past that, at most the resource's list resourceVersion now. Checkpoints of resources this
// replica does not watch are left out.
func (el *Elector) check(ctx context.Context, j *journal.Journal, cm *corev1.ConfigMap, lease term) (journal.Checkpoints, *refusal, error) {
	cp, err := decodeCheckpoints(cm.Data[checkpointKey])
	if err != nil {
		return nil, &refusal{refusedMalformed, err.Error()}, nil
	}
	if w := writtenBy(cm); w != lease || w.holder == "" {
		return nil, &refusal{refusedNotLeaseHolder, fmt.Sprintf("written by %s; the Lease is held by %s", w, lease)}, nil
	}
	reached := map[schema.GroupVersionResource]uint64{}
	for sink, byResource := range cp {
		for gvr, rev := range byResource {
			seen, streams := j.Seen(gvr)
			switch {
			case rev <= seen:
				continue
			case len(streams) == 0:
				delete(byResource, gvr)
				continue
			}
			limit, ok := reached[gvr]
			if !ok {
				if limit, err = el.listRevision(ctx, gvr, streams[0]); err != nil {
					return nil, nil, err
				}
				reached[gvr] = limit
			}
			if rev > limit {
				return nil, &refusal{refusedAheadOfCluster, fmt.Sprintf("sink %s: resource %s: revision %d is beyond the resource's list resourceVersion %d",
					sink, object.ResourceName(gvr), rev, limit)}, nil
			}
		}
	}
	return cp, nil, nil
}

// listRevision is the resourceVersion of a list of one object of the resource, in namespace
// ("" for all): where the cluster is now, at or past every revision of the resource.
func (el *Elector) listRevision(ctx context.Context, gvr schema.GroupVersionResource, namespace string) (uint64, error) {
	path := []string{"/apis", gvr.Group, gvr.Version}
	if gvr.Group == "" {
		path = []string{"/api", gvr.Version}
	}
	if namespace != "" {
		path = append(path, "namespaces", namespace)
	}
	body, err := el.client.Discovery().RESTClient().Get().AbsPath(append(path, gvr.Resource)...).Param("limit", "1").
		SetHeader("Accept", "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json").Do(ctx).Raw()
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", object.ResourceName(gvr), err)
	}
	var list metav1.PartialObjectMetadataList
	if err := json.Unmarshal(body, &list); err != nil {
		return 0, fmt.Errorf("list %s: %w", object.ResourceName(gvr), err)
	}
	rev := object.Revision(list.ResourceVersion)
	if rev == 0 {
		return 0, fmt.Errorf("list %s: resourceVersion %q is not a revision", object.ResourceName(gvr), list.ResourceVersion)
	}
	return rev, nil
}

// fetch reads the checkpoint ConfigMap; nil when it does not exist.
func (el *Elector) fetch(ctx context.Context) (*corev1.ConfigMap, error) {
	cm, err := el.client.CoreV1().ConfigMaps(el.cfg.Namespace).Get(ctx, el.cfg.CheckpointName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return cm, err
}

// publish writes j's checkpoints, naming the leadership tm, unless the ConfigMap holds them
// already. What it holds otherwise is replaced: an earlier leadership's checkpoints, or
// anything else written there; a write naming tm that the cluster has not reached is refused
// and reported before it is replaced. A conflicting write is retried at the next interval.
func (el *Elector) publish(ctx context.Context, j *journal.Journal, tm term) error {
	own := j.Checkpoints()
	cm, err := el.fetch(ctx)
	if err != nil {
		return err
	}
	if cm != nil && writtenBy(cm) == tm {
		stored, r, err := el.check(ctx, j, cm, tm)
		if err != nil {
			return err
		}
		if r != nil {
			el.refused(*r)
		} else if stored.Equal(own) {
			el.accepted("Written", "the checkpoints are this replica's")
			return nil
		}
	}
	data := encodeCheckpoints(own)
	annotations := map[string]string{holderAnnotation: tm.holder, transitionsAnnotation: strconv.Itoa(tm.transitions)}
	if cm == nil {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: el.cfg.CheckpointName, Namespace: el.cfg.Namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "dynwatch"}, Annotations: annotations}, Data: map[string]string{checkpointKey: data}}
		_, err = el.client.CoreV1().ConfigMaps(el.cfg.Namespace).Create(ctx, cm, metav1.CreateOptions{})
	} else {
		cm = cm.DeepCopy()
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		cm.Data[checkpointKey] = data
		maps.Copy(cm.Annotations, annotations)
		_, err = el.client.CoreV1().ConfigMaps(el.cfg.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err == nil {
		el.accepted("Written", "the checkpoints are this replica's")
	}
	return err
}

// refused reports checkpoints that are not acted on: counted every time, logged when they
// were not refused before or are now for another reason.
func (el *Elector) refused(r refusal) {
	el.m.refused.WithLabelValues(r.reason).Inc()
	reason := strings.ToUpper(r.reason[:1]) + r.reason[1:]
	if was := el.setCondition(metav1.ConditionFalse, reason, r.message); was.Status != metav1.ConditionFalse || was.Reason != reason {
		el.log.Warn("checkpoints refused: nothing is trimmed until the ConfigMap holds the Lease holder's checkpoints", "configMap", el.configMap(), "reason", r.reason, "detail", r.message)
	}
}

// accepted reports checkpoints acted on, logging it if they were refused before.
func (el *Elector) accepted(reason, message string) {
	if was := el.setCondition(metav1.ConditionTrue, reason, message); was.Status == metav1.ConditionFalse {
		el.log.Info("checkpoints accepted", "configMap", el.configMap(), "reason", reason)
	}
}

// setCondition sets the CheckpointsAccepted condition and returns what it was.
func (el *Elector) setCondition(status metav1.ConditionStatus, reason, message string) metav1.Condition {
	el.mu.Lock()
	defer el.mu.Unlock()
	var was metav1.Condition
	if c := apimeta.FindStatusCondition(el.status.Conditions, conditionCheckpointsAccepted); c != nil {
		was = *c
	}
	apimeta.SetStatusCondition(&el.status.Conditions, metav1.Condition{Type: conditionCheckpointsAccepted, Status: status, Reason: reason, Message: message})
	return was
}

func (el *Elector) configMap() string { return el.cfg.Namespace + "/" + el.cfg.CheckpointName }

func encodeCheckpoints(cp journal.Checkpoints) string {
	out := map[string]map[string]string{}
	for sink, byResource := range cp {
		out[sink] = map[string]string{}
		for gvr, rev := range byResource {
			out[sink][object.ResourceName(gvr)] = strconv.FormatUint(rev, 10)
		}
	}
	b, _ := json.Marshal(out)
	return string(b)
}

func decodeCheckpoints(s string) (journal.Checkpoints, error) {
	cp := journal.Checkpoints{}
	if s == "" {
		return cp, nil
	}
	var in map[string]map[string]string
	if err := json.Unmarshal([]byte(s), &in); err != nil {
		return nil, fmt.Errorf("%s: %w", checkpointKey, err)
	}
	for sink, byResource := range in {
		cp[sink] = map[schema.GroupVersionResource]uint64{}
		for name, rev := range byResource {
			gvr, err := checkpointResource(name)
			if err != nil {
				return nil, fmt.Errorf("%s: sink %s: %w", checkpointKey, sink, err)
			}
			n, err := strconv.ParseUint(rev, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: sink %s: resource %s: revision %q is not an integer", checkpointKey, sink, name, rev)
			}
			cp[sink][gvr] = max(cp[sink][gvr], n)
		}
	}
	return cp, nil
}

// checkpointResource parses a resource's name in the checkpoints: object.ResourceName's, or
// group/version/resource as releases before it wrote them, so that a rolling upgrade keeps the
// checkpoints the old leader wrote.
func checkpointResource(name string) (schema.GroupVersionResource, error) {
	if i := strings.LastIndex(name, "/"); i >= 0 {
		gv, err := schema.ParseGroupVersion(name[:i])
		if err != nil || gv.Version == "" || name[i+1:] == "" {
			return schema.GroupVersionResource{}, fmt.Errorf("resource %q is not resource.version.group", name)
		}
		return gv.WithResource(name[i+1:]), nil
	}
	return object.ParseResourceName(name)
}
