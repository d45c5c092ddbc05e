// Package faults draws a session's injected tool failures — recorded error answers, timeouts, added latency — from its seed.
package faults

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// Kinds of injected fault.
const (
	KindError   = "error"   // the tool answered one of its recorded error answers; the world is unchanged
	KindTimeout = "timeout" // the tool did not answer within timeout_ms; the world is unchanged
	KindLatency = "latency" // the call ran as usual, answered latency_ms later
)

// Any names the rule for every tool a Spec does not name.
const Any = "*"

// Limits of a Spec.
const (
	DefaultTimeoutMs = 10_000
	MaxTimeoutMs     = 300_000
	MaxLatencyMs     = 60_000
)

// Spec is a session's fault plan: tool name (or "*" for every other tool) → its faults.
type Spec map[string]Tool

// Tool is one tool's faults. Rates are fractions of its calls (0–1); a call times out with probability
// timeout_rate, else fails with a recorded error answer with probability error_rate, so the two add up to at most 1.
type Tool struct {
	ErrorRate   float64  `json:"error_rate,omitempty"`
	TimeoutRate float64  `json:"timeout_rate,omitempty"`
	TimeoutMs   int64    `json:"timeout_ms,omitempty"`
	Latency     *Latency `json:"latency,omitempty"`
}

// Distributions of added latency.
const (
	DistFixed       = "fixed"       // ms
	DistUniform     = "uniform"     // min_ms … max_ms
	DistNormal      = "normal"      // mean_ms, stddev_ms (clamped at 0)
	DistExponential = "exponential" // mean_ms
	DistLogNormal   = "lognormal"   // median_ms, sigma
)

// Latency is added latency drawn from a named distribution, in milliseconds (capped at MaxLatencyMs).
type Latency struct {
	Dist     string  `json:"dist"`
	Ms       float64 `json:"ms,omitempty"`
	MinMs    float64 `json:"min_ms,omitempty"`
	MaxMs    float64 `json:"max_ms,omitempty"`
	MeanMs   float64 `json:"mean_ms,omitempty"`
	StddevMs float64 `json:"stddev_ms,omitempty"`
	MedianMs float64 `json:"median_ms,omitempty"`
	Sigma    float64 `json:"sigma,omitempty"`
}

// Fault is what a call draws: a kind, the latency added before its answer, and for an error the index of the
// recorded error answer given.
type Fault struct {
	Kind      string `json:"kind"`
	LatencyMs int64  `json:"latency_ms"`
	Answer    int    `json:"-"`
}

// FieldError locates a Spec problem: Field is a path under the spec (gift_card.error_rate).
type FieldError struct {
	Field  string
	Detail string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Detail }

// Validate checks a spec against the build's tools: errorAnswers maps each tool to how many distinct error answers
// its recordings hold. A named tool with an error rate needs recorded errors; "*" gives error faults only to the
// tools that have them.
func (sp Spec) Validate(errorAnswers map[string]int) error {
	names := make([]string, 0, len(sp))
	for n := range sp {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		t := sp[name]
		bad := func(field, format string, args ...any) error {
			return &FieldError{Field: name + "." + field, Detail: fmt.Sprintf(format, args...)}
		}
		if _, ok := errorAnswers[name]; !ok && name != Any {
			return &FieldError{Field: name, Detail: fmt.Sprintf("no tool %q in this build (\"*\" names every tool)", name)}
		}
		for _, r := range []struct {
			f string
			v float64
		}{{"error_rate", t.ErrorRate}, {"timeout_rate", t.TimeoutRate}} {
			if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
				return bad(r.f, "a fraction of calls from 0 to 1, got %v", r.v)
			}
		}
		if t.ErrorRate+t.TimeoutRate > 1 {
			return bad("error_rate", "error_rate + timeout_rate is %v, more than every call", t.ErrorRate+t.TimeoutRate)
		}
		if t.ErrorRate > 0 && name != Any && errorAnswers[name] == 0 {
			return bad("error_rate", "the recordings hold no error answer of %s to inject", name)
		}
		if t.TimeoutMs < 0 || t.TimeoutMs > MaxTimeoutMs {
			return bad("timeout_ms", "from 0 to %d, got %d", MaxTimeoutMs, t.TimeoutMs)
		}
		if t.Latency != nil {
			if err := t.Latency.validate(); err != nil {
				return bad("latency."+err.Field, "%s", err.Detail)
			}
		}
	}
	return nil
}

func (l *Latency) validate() *FieldError {
	for _, v := range []float64{l.Ms, l.MinMs, l.MaxMs, l.MeanMs, l.StddevMs, l.MedianMs, l.Sigma} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > MaxLatencyMs {
			return &FieldError{Field: "dist", Detail: fmt.Sprintf("parameters are from 0 to %d ms", MaxLatencyMs)}
		}
	}
	switch l.Dist {
	case DistFixed, DistExponential, DistNormal:
	case DistUniform:
		if l.MaxMs < l.MinMs {
			return &FieldError{Field: "max_ms", Detail: "less than min_ms"}
		}
	case DistLogNormal:
		if l.Sigma > 5 {
			return &FieldError{Field: "sigma", Detail: "at most 5"}
		}
	default:
		return &FieldError{Field: "dist", Detail: fmt.Sprintf("one of fixed, uniform, normal, exponential, lognormal; got %q", l.Dist)}
	}
	return nil
}

// For answers the faults of tool: its own rule, else "*"'s.
func (sp Spec) For(tool string) (Tool, bool) {
	if t, ok := sp[tool]; ok {
		return t, true
	}
	t, ok := sp[Any]
	return t, ok
}

// stream separates this package's draws from any other use of a session's seed.
const stream = 0x6661756c74730001 // "faults" 1

// Draw answers the fault of call number call (1, 2, …) of tool in a session of seed, if any. It is a pure function
// of its arguments: a PRNG seeded by (seed, call) — never the global one or the clock — so the same seed fails the
// same calls in every run, process and replay. errorAnswers is how many recorded error answers the tool has.
func (sp Spec) Draw(seed, call int64, tool string, errorAnswers int) (Fault, bool) {
	t, ok := sp.For(tool)
	if !ok {
		return Fault{}, false
	}
	r := rand.New(rand.NewPCG(uint64(seed), stream^uint64(call)*0x9e3779b97f4a7c15))
	u := r.Float64()    // which fault
	pick := r.Float64() // which error answer
	lat := t.sample(r)  // latency, drawn last
	errRate := t.ErrorRate
	if errorAnswers == 0 {
		errRate = 0
	}
	switch {
	case u < t.TimeoutRate:
		ms := t.TimeoutMs
		if ms == 0 {
			ms = DefaultTimeoutMs
		}
		return Fault{Kind: KindTimeout, LatencyMs: ms}, true
	case u < t.TimeoutRate+errRate:
		return Fault{Kind: KindError, LatencyMs: lat, Answer: min(int(pick*float64(errorAnswers)), errorAnswers-1)}, true
	case t.Latency != nil:
		return Fault{Kind: KindLatency, LatencyMs: lat}, true
	}
	return Fault{}, false
}

// sample draws the added latency in whole milliseconds (0 with no latency rule).
func (t Tool) sample(r *rand.Rand) int64 {
	l := t.Latency
	if l == nil {
		return 0
	}
	var ms float64
	switch l.Dist {
	case DistFixed:
		ms = l.Ms
	case DistUniform:
		ms = l.MinMs + r.Float64()*(l.MaxMs-l.MinMs)
	case DistNormal:
		ms = l.MeanMs + r.NormFloat64()*l.StddevMs
	case DistExponential:
		ms = r.ExpFloat64() * l.MeanMs
	case DistLogNormal:
		ms = l.MedianMs * math.Exp(r.NormFloat64()*l.Sigma)
	}
	return int64(math.Round(min(max(ms, 0), MaxLatencyMs)))
}
