// Package osmem returns the Go heap's free memory to the operating system after a spike, rate-limited.
package osmem

import (
	"runtime/debug"
	"sync"
	"time"
)

// DefaultEvery is the shortest time between two returns unless a Returner is given one.
const DefaultEvery = 10 * time.Second

// Returner returns the heap's free memory to the OS (debug.FreeOSMemory) once a spike is over, at most once per
// Every: after large request bodies are done (Begin, End), and after memory was let go in bulk, such as session
// worlds dropped by mass closes (Freed). The Go runtime would keep a spike's pages for minutes (longer with a high
// GOGC, or when no collection follows), so one burst would leave the process at its peak size. A return is a full
// collection and a scavenge: its cost is why it is rate-limited. The zero value is not ready: use New.
type Returner struct {
	every time.Duration
	free  func()

	mu    sync.Mutex
	large int // spikes in flight (Begin without End): no return while one is
	last  time.Time
	timer *time.Timer
}

// New returns a Returner returning memory at most once per every (0: DefaultEvery) by calling free (nil:
// debug.FreeOSMemory).
func New(every time.Duration, free func()) *Returner {
	if every <= 0 {
		every = DefaultEvery
	}
	if free == nil {
		free = debug.FreeOSMemory
	}
	return &Returner{every: every, free: free}
}

// Begin marks a spike in flight (a large request body being read): memory is not returned until it ends.
func (m *Returner) Begin() {
	m.mu.Lock()
	m.large++
	m.mu.Unlock()
}

// End marks a spike done and schedules the return once the last one is: at once, or when Every has passed since the
// last return.
func (m *Returner) End() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.large--
	m.schedule(0)
}

// Freed says memory was let go (a session world dropped) and schedules a return as End does, but a tenth of Every
// later at the soonest, so the frees of a burst (a mass close) are done when it runs: a burst makes one return, and
// a steady trickle at most one per Every.
func (m *Returner) Freed() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.schedule(m.every / 10)
}

// Pending reports whether a return is scheduled and has not run yet.
func (m *Returner) Pending() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.timer != nil
}

// schedule starts the timer of the next return, at least soonest from now, unless one is pending or a spike is in
// flight; m.mu is held.
func (m *Returner) schedule(soonest time.Duration) {
	if m.large > 0 || m.timer != nil {
		return
	}
	wait := max(m.every-time.Since(m.last), soonest)
	m.timer = time.AfterFunc(wait, m.run)
}

func (m *Returner) run() {
	m.mu.Lock()
	m.timer = nil
	if m.large > 0 {
		m.mu.Unlock()
		return // a spike began meanwhile: its end schedules the return
	}
	m.last = time.Now()
	m.mu.Unlock()
	m.free()
}

// Stop cancels a pending return.
func (m *Returner) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.timer != nil {
		m.timer.Stop()
		m.timer = nil
	}
}
