package leader

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynwatch/dynwatch/journal"
	"github.com/dynwatch/dynwatch/object"
)

// exchange writes the journal's checkpoints to the checkpoint ConfigMap every interval while
// this replica leads and its fence holds, and while it follows reads them and trims the
// journal to them.
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
		op := "read"
		if el.Leading() {
			op = "write"
			if _, held := el.fence.held(); held {
				err = el.publish(ctx, j.Checkpoints())
			}
		} else {
			var cp journal.Checkpoints
			if cp, _, err = el.fetch(ctx); err == nil {
				j.Trim(cp)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			el.m.checkpoints.WithLabelValues(op, "error").Inc()
			el.log.Warn("checkpoint exchange failed", "operation", op, "configMap", el.cfg.Namespace+"/"+el.cfg.CheckpointName, "err", err)
			continue
		}
		el.m.checkpoints.WithLabelValues(op, "ok").Inc()
		now := time.Now().UTC()
		el.mu.Lock()
		el.status.Checkpoint = &now
		el.mu.Unlock()
	}
}

// checkpointKey is the ConfigMap's data key holding the checkpoints as JSON:
// {"sink": {"deployments.v1.apps": "1234"}} (see object.ResourceName).
const checkpointKey = "checkpoints.json"

// fetch reads the checkpoints and the ConfigMap they came from (nil when it does not exist).
func (el *Elector) fetch(ctx context.Context) (journal.Checkpoints, *corev1.ConfigMap, error) {
	cm, err := el.client.CoreV1().ConfigMaps(el.cfg.Namespace).Get(ctx, el.cfg.CheckpointName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return journal.Checkpoints{}, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	cp, err := decodeCheckpoints(cm.Data[checkpointKey])
	if err != nil {
		return nil, nil, fmt.Errorf("configmap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return cp, cm, nil
}

// publish merges cp into the stored checkpoints, which only ever rise, and writes them if any
// rose. A conflicting write is retried at the next interval.
func (el *Elector) publish(ctx context.Context, cp journal.Checkpoints) error {
	stored, cm, err := el.fetch(ctx)
	if err != nil {
		return err
	}
	if !stored.Merge(cp) {
		return nil
	}
	data := map[string]string{checkpointKey: encodeCheckpoints(stored)}
	if cm == nil {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: el.cfg.CheckpointName, Namespace: el.cfg.Namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "dynwatch"}}, Data: data}
		_, err = el.client.CoreV1().ConfigMaps(el.cfg.Namespace).Create(ctx, cm, metav1.CreateOptions{})
		return err
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[checkpointKey] = data[checkpointKey]
	_, err = el.client.CoreV1().ConfigMaps(el.cfg.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
	return err
}

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
