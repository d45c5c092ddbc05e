package osmem

import (
	"sync/atomic"
	"testing"
	"time"
)

// Memory is returned once no spike is in flight, and at most once per every: a second spike soon after the first
// waits for the rest of the period instead of returning memory again at once. Frees in bulk make one return.
func TestReturner(t *testing.T) {
	freed := make(chan struct{}, 4)
	var n atomic.Int32
	m := New(time.Hour, func() { n.Add(1); freed <- struct{}{} })
	defer m.Stop()

	m.Begin()
	m.Begin()
	m.End()
	if m.Pending() || n.Load() != 0 {
		t.Fatalf("with a spike still in flight: pending %v, freed %d times; want neither", m.Pending(), n.Load())
	}
	m.Freed() // memory let go while a spike is in flight waits for its end too
	if m.Pending() {
		t.Fatal("a free during a spike scheduled a return")
	}
	m.End()
	<-freed // the first return is at once
	m.Begin()
	m.End()
	if !m.Pending() || n.Load() != 1 {
		t.Fatalf("second spike within the period: pending %v, freed %d times; want a pending return and 1", m.Pending(), n.Load())
	}
	for range 1000 {
		m.Freed()
	}
	if !m.Pending() || n.Load() != 1 {
		t.Fatalf("a thousand frees within the period: pending %v, freed %d times; want one pending return", m.Pending(), n.Load())
	}
}

// A burst of frees makes one return, a tenth of the period after the first at the soonest (so the burst is over
// when it runs); frees after the period return again.
func TestReturnerFreedBurst(t *testing.T) {
	freed := make(chan struct{}, 4)
	var n atomic.Int32
	m := New(time.Hour, func() { n.Add(1); freed <- struct{}{} })
	defer m.Stop()
	m.Freed()
	if !m.Pending() || n.Load() != 0 {
		t.Fatalf("a first free: pending %v, freed %d times; want a return pending, not run at once", m.Pending(), n.Load())
	}
	m.Stop()
	m = New(10*time.Millisecond, func() { n.Add(1); freed <- struct{}{} })
	defer m.Stop()
	for range 1000 {
		m.Freed()
	}
	<-freed
	if n.Load() != 1 {
		t.Fatalf("a burst of frees returned memory %d times, want once", n.Load())
	}
	time.Sleep(20 * time.Millisecond)
	m.Freed()
	<-freed
}
