package httpapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
)

// reviewer is a TokenReview stand-in: "good" is alice, anything else is no one. While held,
// every review waits until released.
type reviewer struct {
	mu      sync.Mutex
	reviews int
	hold    chan struct{}
	entered chan struct{}
}

func (r *reviewer) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	r.mu.Lock()
	r.reviews++
	hold := r.hold
	r.mu.Unlock()
	if hold != nil {
		r.entered <- struct{}{}
		<-hold
	}
	if token == "good" {
		return &authenticator.Response{User: &user.DefaultInfo{Name: "alice"}}, true, nil
	}
	return nil, false, nil
}

func (r *reviewer) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reviews
}

func TestAdmissionSpendsTheUnknownRateOnlyOnUnknownCredentials(t *testing.T) {
	r := &reviewer{}
	q := newFairQueue(rate.NewLimiter(0, 2), 32, 2, 128, 50*time.Millisecond) // two unknown credentials, then none
	runQueue(t, q)
	a := newAdmission(r, q)
	ctx := withConnection(context.Background(), "192.0.2.1:40000")
	if _, ok, err := a.AuthenticateToken(ctx, "good"); !ok || err != nil {
		t.Fatalf("the first review of a good credential: ok %v, err %v", ok, err)
	}
	if _, _, err := a.AuthenticateToken(ctx, "forged-1"); err != nil {
		t.Fatalf("the second unknown credential: %v; the burst allows two", err)
	}
	if _, _, err := a.AuthenticateToken(ctx, "forged-2"); !errors.Is(err, errReviewsBusy) {
		t.Fatalf("the third unknown credential: %v; want errReviewsBusy", err)
	}
	for range 3 {
		if _, ok, err := a.AuthenticateToken(ctx, "good"); !ok || err != nil {
			t.Fatalf("a known credential once the rate is spent: ok %v, err %v", ok, err)
		}
	}
	if n := r.count(); n != 5 {
		t.Errorf("%d reviews reached the reviewer; want 5 (2 unknown, 3 known)", n)
	}
}

// heldAdmission is admission over a reviewer that holds every review until released, with a
// queue of unlimited rate, seats turns at once and perFlow per connection.
func heldAdmission(t *testing.T, seats, perFlow int) (*reviewer, *admission) {
	r := &reviewer{hold: make(chan struct{}), entered: make(chan struct{}, 256)}
	q := newFairQueue(rate.NewLimiter(rate.Inf, 0), seats, perFlow, 4*seats, time.Minute)
	runQueue(t, q)
	return r, newAdmission(r, q)
}

func TestAdmissionQueuesByTheConnectionItFindsInTheContext(t *testing.T) {
	r, a := heldAdmission(t, 8, 2)
	flood := withConnection(context.Background(), "192.0.2.1:40000")
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { _, _, _ = a.AuthenticateToken(flood, fmt.Sprintf("forged-%d", i)) })
		<-r.entered
	}
	if _, _, err := a.AuthenticateToken(flood, "forged-2"); !errors.Is(err, errReviewsBusy) {
		t.Errorf("a third review on one connection with a share of 2: %v; want errReviewsBusy", err)
	}
	other := withConnection(context.Background(), "192.0.2.1:40001")
	wg.Go(func() {
		if _, ok, err := a.AuthenticateToken(other, "good"); !ok || err != nil {
			t.Errorf("another connection's review: ok %v, err %v", ok, err)
		}
	})
	<-r.entered
	close(r.hold)
	wg.Wait()
}

// Requests that carry one new credential at once share its review: none is refused for the
// connection's share, which the first holds until the review answers.
func TestManyRequestsAtOnceWithOneNewCredentialAreAllAnswered(t *testing.T) {
	r, a := heldAdmission(t, 8, 2)
	ctx := withConnection(context.Background(), "192.0.2.1:40000")
	var wg sync.WaitGroup
	for range 200 { // as 200 watches opened at once with a new token: far beyond its connection's share of 2
		wg.Go(func() {
			if _, ok, err := a.AuthenticateToken(ctx, "good"); !ok || err != nil {
				t.Errorf("one of 200 requests with one new credential: ok %v, err %v", ok, err)
			}
		})
	}
	<-r.entered
	close(r.hold)
	wg.Wait()
}
