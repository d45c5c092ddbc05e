package api

import (
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxRateBuckets bounds a keyedLimiter's memory: past it, buckets that have refilled are forgotten first.
const maxRateBuckets = 10000

// keyedLimiter is one token bucket (golang.org/x/time/rate) per key: a client address, a workspace. The
// collect, query and console sign-in limits are all one of these.
type keyedLimiter struct {
	rate  rate.Limit
	burst int
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
}

// newKeyedLimiter makes a limiter of perSecond tokens a second and bursts of burst per key; now is its clock
// (nil: time.Now).
// failureLimiter is the limiter of failed attempts per key at perMin a minute with bursts of burst: nil when perMin
// is negative (off); zero values take the defaults given.
func failureLimiter(perMin float64, burst int, defPerMin float64, defBurst int, now func() time.Time) *keyedLimiter {
	if perMin < 0 {
		return nil
	}
	if perMin == 0 {
		perMin = defPerMin
	}
	if burst <= 0 {
		burst = defBurst
	}
	return newKeyedLimiter(perMin/60, burst, now)
}

func newKeyedLimiter(perSecond float64, burst int, now func() time.Time) *keyedLimiter {
	if now == nil {
		now = time.Now
	}
	return &keyedLimiter{rate: rate.Limit(perSecond), burst: burst, now: now, buckets: map[string]*rate.Limiter{}}
}

// allow takes a token from key's bucket, or answers how long until one is there; a refused request takes none.
func (l *keyedLimiter) allow(key string) (bool, time.Duration) {
	now := l.now()
	lim := l.bucket(key, now)
	res := lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return false, d
	}
	return true, 0
}

// wait answers how long until key's bucket holds a token, taking none: zero when one is there now.
func (l *keyedLimiter) wait(key string) time.Duration {
	now := l.now()
	l.mu.Lock()
	lim := l.buckets[key]
	l.mu.Unlock()
	if lim == nil {
		return 0
	}
	tokens := lim.TokensAt(now)
	if tokens >= 1 {
		return 0
	}
	return time.Duration((1 - tokens) / float64(l.rate) * float64(time.Second))
}

func (l *keyedLimiter) bucket(key string, now time.Time) *rate.Limiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := l.buckets[key]
	if lim == nil {
		if len(l.buckets) >= maxRateBuckets {
			l.prune(now)
		}
		lim = rate.NewLimiter(l.rate, l.burst)
		l.buckets[key] = lim
	}
	return lim
}

// prune drops the buckets that have refilled: forgetting them changes nothing.
func (l *keyedLimiter) prune(now time.Time) {
	for key, lim := range l.buckets {
		if lim.TokensAt(now) >= float64(l.burst) {
			delete(l.buckets, key)
		}
	}
}

// clientAddress is the address a request came from: X-Forwarded-For's first entry when trustForwarded (only
// behind a proxy that writes it), else the connection's host.
func clientAddress(remoteAddr, forwardedFor string, trustForwarded bool) string {
	if trustForwarded {
		if xff := forwardedFor; xff != "" {
			first, _, _ := strings.Cut(xff, ",")
			return strings.TrimSpace(first)
		}
	}
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return remoteAddr
	}
	return host
}
