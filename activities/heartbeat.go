package activities

import (
	"context"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
)

// beat heartbeats a running activity every period with its latest progress, until stopped. The progress is what
// a retry of the activity (after its worker died) reads back with activity.GetHeartbeatDetails to resume, so every
// heartbeat carries it: a heartbeat without details would erase it.
type beat struct {
	ctx  context.Context
	mu   sync.Mutex
	last any
	done chan struct{}
	wg   sync.WaitGroup
}

// startBeat records progress (nil for none) at once and then every period.
func startBeat(ctx context.Context, period time.Duration, progress any) *beat {
	b := &beat{ctx: ctx, last: progress, done: make(chan struct{})}
	b.record()
	b.wg.Go(func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-b.done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				b.record()
			}
		}
	})
	return b
}

func (b *beat) record() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last == nil {
		activity.RecordHeartbeat(b.ctx)
		return
	}
	activity.RecordHeartbeat(b.ctx, b.last)
}

// set makes progress the activity's latest and records it now.
func (b *beat) set(progress any) {
	b.mu.Lock()
	b.last = progress
	b.mu.Unlock()
	b.record()
}

func (b *beat) stop() { close(b.done); b.wg.Wait() }

// resumeFrom decodes the progress the activity's previous attempt recorded into v; false when there is none or it
// is not of v's shape (an attempt of an older worker), so the activity starts over.
func resumeFrom(ctx context.Context, v any) bool {
	if !activity.HasHeartbeatDetails(ctx) {
		return false
	}
	return activity.GetHeartbeatDetails(ctx, v) == nil
}

// Heartbeat records a heartbeat of the running activity at once and then every period until stop is called: for an
// activity that waits on something slow (a model) with no progress to resume from. In a local activity it does
// nothing.
func Heartbeat(ctx context.Context, period time.Duration) (stop func()) {
	return startBeat(ctx, period, nil).stop
}
