package subscription

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynwatch/dynwatch/config"
	"github.com/dynwatch/dynwatch/test/testbed"
)

var configmaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// startReviewing starts the test bed, lets user watch configmaps in namespace "granted" and
// returns a Reviewer asking it every period, and the reviews metric.
func startReviewing(t *testing.T, user string, every time.Duration) (*Reviewer, *prometheus.CounterVec) {
	t.Helper()
	r, _ := startReviewingOn(t, user, every)
	return r, r.reviews
}

// startReviewingOn is startReviewing, and returns the test bed's cluster.
func startReviewingOn(t *testing.T, user string, every time.Duration) (*Reviewer, *testbed.Cluster) {
	t.Helper()
	cluster, err := testbed.Start(t.Context(), testbed.Options{Out: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Stop)
	fast := rest.CopyConfig(cluster.Config)
	fast.QPS, fast.Burst = -1, 0
	cs := kubernetes.NewForConfigOrDie(fast)
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "granted"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "watch-configmaps"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"watch"}}}}
	if _, err := cs.RbacV1().ClusterRoles().Create(t.Context(), role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "watch-configmaps", Namespace: "granted"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}}
	if _, err := cs.RbacV1().RoleBindings("granted").Create(t.Context(), binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	r, err := NewReviewer(slog.New(slog.DiscardHandler), reg, cs.AuthorizationV1().SubjectAccessReviews(), every)
	if err != nil {
		t.Fatal(err)
	}
	// RBAC's cache catches up with the binding within a moment.
	subject := &config.Subject{Username: user}
	testbed.Eventually(t, 30*time.Second, func() error {
		if ok, err := r.review(t.Context(), subject, decisionKey{subject: subject.Key(), verb: "watch", resource: configmaps.GroupResource(), namespace: "granted"}); err != nil || !ok {
			return fmt.Errorf("%s may not watch configmaps in granted yet (%w)", user, err)
		}
		return nil
	})
	r.entries = map[decisionKey]*decision{}
	return r, cluster
}

// run runs r until the test ends.
func run(t *testing.T, r *Reviewer) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// TestKnownNeverWaitsOnAReviewAndAsksInTheBackground: Known answers at once, unknown, for a
// decision never made, and the decision once its review has come back in the background;
// Allowed agrees with it. Each decision is asked once.
func TestKnownNeverWaitsOnAReviewAndAsksInTheBackground(t *testing.T) {
	r, reviews := startReviewing(t, "known-alice", time.Hour)
	alice := &config.Subject{Username: "known-alice"}
	alice.Seal()
	asked := func() float64 {
		return testutil.ToFloat64(reviews.WithLabelValues("allowed")) + testutil.ToFloat64(reviews.WithLabelValues("denied"))
	}
	before := asked()
	run(t, r)
	for _, tt := range []struct {
		namespace string
		allowed   bool
		knownAt   bool // known at once: the cluster-wide decision, asked for granted already
	}{{"granted", true, false}, {"other", false, false}, {"", false, true}} {
		if allowed, known := r.Known(alice, configmaps, tt.namespace); known != tt.knownAt {
			t.Fatalf("namespace %q: before its review Known answered %v known %v, want known %v", tt.namespace, allowed, known, tt.knownAt)
		}
		testbed.Eventually(t, 30*time.Second, func() error {
			allowed, known := r.Known(alice, configmaps, tt.namespace)
			if !known || allowed != tt.allowed {
				return fmt.Errorf("namespace %q: Known answers allowed %v known %v, want %v known", tt.namespace, allowed, known, tt.allowed)
			}
			return nil
		})
		if ok, err := r.Allowed(alice, configmaps, tt.namespace); err != nil || ok != tt.allowed {
			t.Errorf("namespace %q: Allowed answers %v (%v), want %v", tt.namespace, ok, err, tt.allowed)
		}
	}
	// granted: the cluster-wide decision (denied) and the namespace's; other: its own; "":
	// the cluster-wide one again. Each asked once.
	if got := asked() - before; got != 3 {
		t.Errorf("%v reviews, want 3: one for each decision", got)
	}
}

// TestDecisionsMadeAtOnceAreAskedAgainSpreadOverThePeriod: 40 decisions made at once are asked
// again a period later one at a time, spaced by the period over 1.25 times their number, not
// at once; every one of them is asked again. (A lower bound on the spacing only: on a loaded
// machine the reviews come later, never sooner.)
func TestDecisionsMadeAtOnceAreAskedAgainSpreadOverThePeriod(t *testing.T) {
	const every, namespaces = 4 * time.Second, 40
	r, reviews := startReviewing(t, "spread-bob", every)
	bob := &config.Subject{Username: "spread-bob"}
	bob.Seal()
	before := testutil.ToFloat64(reviews.WithLabelValues("allowed")) + testutil.ToFloat64(reviews.WithLabelValues("denied"))
	for i := range namespaces {
		if _, err := r.Allowed(bob, configmaps, fmt.Sprintf("ns-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	decisions := len(r.entries) // the namespaces' and the cluster-wide one
	made := time.Now()
	run(t, r)
	// When each decision was asked again: its review's answer is recorded as it comes back.
	var checked []time.Time
	testbed.Eventually(t, 5*every, func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		checked = checked[:0]
		for _, d := range r.entries {
			if d.checked.After(made) {
				checked = append(checked, d.checked)
			}
		}
		if len(checked) < decisions {
			return fmt.Errorf("%d of %d decisions asked again", len(checked), decisions)
		}
		return nil
	})
	slices.SortFunc(checked, time.Time.Compare)
	spacing := time.Duration(float64(every) / (1.25 * float64(decisions)))
	if took, least := checked[len(checked)-1].Sub(checked[0]), time.Duration(decisions-1)*spacing; took < least {
		t.Errorf("the %d decisions were asked again within %s, want them spread over at least %s (spacing %s)", decisions, took, least, spacing)
	}
	if got := testutil.ToFloat64(reviews.WithLabelValues("allowed")) + testutil.ToFloat64(reviews.WithLabelValues("denied")) - before; got < float64(2*decisions) {
		t.Errorf("%v reviews, want each of the %d decisions asked twice", got, decisions)
	}
}
