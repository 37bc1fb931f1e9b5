package httpapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// sar is a SubjectAccessReview stand-in: alice may read her namespace, no one anything else.
// While held, every review waits until released.
type sar struct {
	mu      sync.Mutex
	reviews map[string]int // by user
	hold    chan struct{}
	entered chan string
}

func (s *sar) Authorize(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	s.mu.Lock()
	s.reviews[a.GetUser().GetName()]++
	hold := s.hold
	s.mu.Unlock()
	if hold != nil {
		s.entered <- a.GetUser().GetName()
		select {
		case <-hold:
		case <-ctx.Done():
			return authorizer.DecisionNoOpinion, "", ctx.Err()
		}
	}
	if a.GetUser().GetName() == "alice" && a.GetNamespace() == "alice" {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "no grant", nil
}

func (s *sar) count(user string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reviews[user]
}

func read(name, namespace, object string) authorizer.Attributes {
	return &authorizer.AttributesRecord{User: &user.DefaultInfo{Name: name}, Verb: "get", ResourceRequest: true,
		APIVersion: "v1", Resource: "configmaps", Namespace: namespace, Name: object}
}

func TestOneUsersRandomNamesEvictNoOneElsesDecisions(t *testing.T) {
	s := &sar{reviews: map[string]int{}}
	q := newFairQueue(rate.NewLimiter(rate.Inf, 0), 32, 8, 128, time.Minute)
	runQueue(t, q)
	a := newAuthorization(s, q, time.Hour, time.Hour, time.Minute)
	ctx := context.Background()
	if d, _, err := a.Authorize(ctx, read("alice", "alice", "cm")); d != authorizer.DecisionAllow || err != nil {
		t.Fatalf("alice's read: %v, %v; want allowed", d, err)
	}
	for i := range 10 * cachedDecisionsPerUser {
		if d, _, err := a.Authorize(ctx, read("mallory", fmt.Sprintf("ns-%d", i), fmt.Sprintf("cm-%d", i))); d == authorizer.DecisionAllow || err != nil {
			t.Fatalf("mallory's read %d: %v, %v; want no opinion", i, d, err)
		}
	}
	if d, _, err := a.Authorize(ctx, read("alice", "alice", "cm")); d != authorizer.DecisionAllow || err != nil {
		t.Fatalf("alice's read again: %v, %v; want allowed", d, err)
	}
	if n := s.count("alice"); n != 1 {
		t.Errorf("alice's decision was reviewed %d times; want once, then cached through mallory's %d names", n, 10*cachedDecisionsPerUser)
	}
	if d, _, _ := a.Authorize(ctx, read("mallory", "ns-0", "cm-0")); d == authorizer.DecisionAllow {
		t.Fatal("mallory's read of ns-0: allowed")
	}
	if n := s.count("mallory"); n != 10*cachedDecisionsPerUser+1 {
		t.Errorf("mallory's reviews: %d; want %d (her oldest decision evicted by her own)", n, 10*cachedDecisionsPerUser+1)
	}
}

// heldAuthorization is authorization over a stand-in that holds every review until released,
// with a queue of unlimited rate, seats turns at once and perFlow per user, and a review
// timeout.
func heldAuthorization(t *testing.T, seats, perFlow int, timeout time.Duration) (*sar, *authorization) {
	s := &sar{reviews: map[string]int{}, hold: make(chan struct{}), entered: make(chan string, 64)}
	q := newFairQueue(rate.NewLimiter(rate.Inf, 0), seats, perFlow, 4*seats, time.Minute)
	runQueue(t, q)
	return s, newAuthorization(s, q, time.Hour, time.Hour, timeout)
}

func TestAUsersReviewsWaitingDelayNoOneElsesBeyondTheirTurn(t *testing.T) {
	s, a := heldAuthorization(t, 4, 2, time.Minute)
	var wg sync.WaitGroup
	for i := range 2 { // mallory's share: both under review, held
		wg.Go(func() { _, _, _ = a.Authorize(context.Background(), read("mallory", fmt.Sprintf("ns-%d", i), "cm")) })
		<-s.entered
	}
	if _, _, err := a.Authorize(context.Background(), read("mallory", "ns-x", "cm")); !errors.Is(err, errReviewsBusy) {
		t.Errorf("mallory beyond her share: %v; want errReviewsBusy at once", err)
	}
	wg.Go(func() {
		if d, _, err := a.Authorize(context.Background(), read("alice", "alice", "cm")); d != authorizer.DecisionAllow || err != nil {
			t.Errorf("alice's read beside mallory's share: %v, %v; want allowed", d, err)
		}
	})
	if who := <-s.entered; who != "alice" {
		t.Errorf("%s's review entered; want alice's", who)
	}
	close(s.hold)
	wg.Wait()
}

func TestAReviewThatDoesNotAnswerEndsAtItsDeadlineAndIsNotCached(t *testing.T) {
	s, a := heldAuthorization(t, 4, 2, 50*time.Millisecond)
	if _, _, err := a.Authorize(context.Background(), read("alice", "alice", "cm")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a review that never answers: %v; want its deadline", err)
	}
	close(s.hold)
	if d, _, err := a.Authorize(context.Background(), read("alice", "alice", "cm")); d != authorizer.DecisionAllow || err != nil {
		t.Fatalf("the same read once reviews answer: %v, %v; want allowed", d, err)
	}
	if n := s.count("alice"); n != 2 {
		t.Errorf("%d reviews; want 2 (the failure was not cached)", n)
	}
}

// Identical requests at once share their review: none is refused for the user's share, which
// the first holds until the review answers.
func TestIdenticalRequestsAtOnceBeyondTheUsersShareAreAllAnswered(t *testing.T) {
	s, a := heldAuthorization(t, 32, 8, time.Minute)
	var wg sync.WaitGroup
	for range 200 { // as 200 watches of one namespace opened at once: far beyond alice's share of 8
		wg.Go(func() {
			if d, _, err := a.Authorize(context.Background(), read("alice", "alice", "")); d != authorizer.DecisionAllow || err != nil {
				t.Errorf("one of 200 identical requests: %v, %v; want allowed", d, err)
			}
		})
	}
	<-s.entered
	close(s.hold)
	wg.Wait()
}
