package workflows

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/doppel-dev/doppel/activities"
)

// A delivery whose receiver fails is attempted again with doubling waits until it answers; it is not marked failed.
func TestWebhookDeliveryRetriesWithBackoff(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	RegisterWebhooks(env)
	var a *activities.Webhooks
	var at []time.Time
	env.OnActivity(a.Deliver, mock.Anything, mock.Anything).Return(func(ctx context.Context, in activities.DeliverInput) error {
		at = append(at, env.Now())
		if len(at) < 5 {
			return temporal.NewApplicationError("HTTP 503", activities.ErrTypeDeliveryFailed)
		}
		return nil
	})
	failed := false
	env.OnActivity(a.FailDelivery, mock.Anything, mock.Anything, mock.Anything).Return(func(context.Context, string, string) error {
		failed = true
		return nil
	})
	env.ExecuteWorkflow(WebhookDeliveryWorkflowName, WebhookDeliveryInput{DeliveryID: "whd_1",
		Policy: DeliveryPolicy{Window: time.Hour, Initial: time.Second, Max: 4 * time.Second}})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	if len(at) != 5 || failed {
		t.Fatalf("%d attempts, failed=%v; want 5 attempts and success", len(at), failed)
	}
	var waits []time.Duration
	for i := 1; i < len(at); i++ {
		waits = append(waits, at[i].Sub(at[i-1]).Round(time.Second))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} // doubling, capped at Max
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits between attempts %v, want %v", waits, want)
		}
	}
}

// A receiver that never answers 2xx: attempts stop when the window closes and the delivery is marked failed.
func TestWebhookDeliveryFailsAfterWindow(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	RegisterWebhooks(env)
	var a *activities.Webhooks
	attempts := 0
	env.OnActivity(a.Deliver, mock.Anything, mock.Anything).Return(func(context.Context, activities.DeliverInput) error {
		attempts++
		return temporal.NewApplicationError("connection refused", activities.ErrTypeDeliveryFailed)
	})
	var reason string
	env.OnActivity(a.FailDelivery, mock.Anything, "whd_1", mock.Anything).Return(func(_ context.Context, _ string, r string) error {
		reason = r
		return nil
	})
	env.ExecuteWorkflow(WebhookDeliveryWorkflowName, WebhookDeliveryInput{DeliveryID: "whd_1",
		Policy: DeliveryPolicy{Window: 10 * time.Minute, Initial: 10 * time.Second, Max: time.Minute}})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	// 10s, 20s, 40s, then every minute: about a dozen attempts fit in ten minutes.
	if attempts < 8 || attempts > 14 {
		t.Errorf("%d attempts in a 10-minute window, want about 12", attempts)
	}
	if reason == "" || !strings.Contains(reason, "10m0s") {
		t.Errorf("failure reason %q, want it to name the window", reason)
	}
}
