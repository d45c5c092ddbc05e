package api

import (
	"sync/atomic"
	"testing"
	"time"
)

// The memory of large bodies is returned once none is in flight, and at most once per every: a second spike soon
// after the first waits for the rest of the period instead of returning memory again at once.
func TestMemReturner(t *testing.T) {
	freed := make(chan struct{}, 4)
	var n atomic.Int32
	m := &memReturner{every: time.Hour, free: func() { n.Add(1); freed <- struct{}{} }}

	m.begin()
	m.begin()
	m.end()
	m.mu.Lock()
	pending := m.timer != nil
	m.mu.Unlock()
	if pending || n.Load() != 0 {
		t.Fatalf("with a large body still in flight: timer %v, freed %d times; want neither", pending, n.Load())
	}
	m.end()
	<-freed // the first return is at once
	m.begin()
	m.end()
	m.mu.Lock()
	pending = m.timer != nil
	m.mu.Unlock()
	if !pending || n.Load() != 1 {
		t.Fatalf("second spike within the period: timer %v, freed %d times; want a pending return and 1", pending, n.Load())
	}
	m.timer.Stop()
}
