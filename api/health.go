package api

import (
	"context"
	"io/fs"
	"net/http"
	"os"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
)

var typeOfEnvelope = reflect.TypeOf(Envelope{})

// HealthOutput is the liveness answer.
type HealthOutput struct {
	Body struct {
		Status string `json:"status" example:"ok" doc:"Always ok: the process is serving."`
	}
}

// ReadyOutput is the readiness answer.
type ReadyOutput struct {
	Body struct {
		Status string            `json:"status" example:"ready"`
		Checks map[string]string `json:"checks" doc:"Each readiness check and its result (ok)."`
	}
}

func registerHealth(a huma.API, opts Options) {
	timeout := opts.ReadyTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	huma.Register(a, huma.Operation{
		OperationID: "health.live",
		Method:      http.MethodGet,
		Path:        "/healthz",
		Summary:     "Liveness",
		Description: "Answers 200 while the process serves requests.",
		Tags:        []string{"health"},
		Metadata:    map[string]any{MetaVerb: false},
	}, func(ctx context.Context, _ *struct{}) (*HealthOutput, error) {
		out := &HealthOutput{}
		out.Body.Status = "ok"
		return out, nil
	})

	checks := opts.Readiness
	huma.Register(a, huma.Operation{
		OperationID: "health.ready",
		Method:      http.MethodGet,
		Path:        "/readyz",
		Summary:     "Readiness",
		Description: "Answers 200 only when every dependency check (database, blob store, Temporal, …) answers; " +
			"otherwise 503 with code `unavailable` and a detail naming each failed check.",
		Tags:     []string{"health"},
		Errors:   []int{http.StatusServiceUnavailable},
		Metadata: map[string]any{MetaVerb: false},
	}, func(ctx context.Context, _ *struct{}) (*ReadyOutput, error) {
		names := make([]string, 0, len(checks))
		for n := range checks {
			names = append(names, n)
		}
		sort.Strings(names)
		results := make([]error, len(names))
		var wg sync.WaitGroup
		for i, n := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				results[i] = runCheck(cctx, checks[n])
			}()
		}
		wg.Wait()
		out := &ReadyOutput{}
		out.Body.Status = "ready"
		out.Body.Checks = map[string]string{}
		var failed []string
		for i, n := range names {
			if results[i] != nil {
				// Anyone may ask: say which check failed and how, not where the server keeps its files.
				failed = append(failed, n+": "+withoutPaths(results[i]))
				continue
			}
			out.Body.Checks[n] = "ok"
		}
		if len(failed) > 0 {
			return nil, Unavailable("not ready: %s", strings.Join(failed, "; "))
		}
		return out, nil
	})
}

// runCheck runs a check, giving up when ctx ends even if the check ignores it.
func runCheck(ctx context.Context, c func(context.Context) error) error {
	done := make(chan error, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				done <- errorString("check panicked")
			}
		}()
		done <- c(ctx)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// withoutPaths is err's message with the file paths its os errors (*fs.PathError, *os.LinkError) name cut out:
// "open /var/lib/doppel/doppel.db: permission denied" says "open: permission denied".
func withoutPaths(err error) string {
	msg := err.Error()
	var cut func(error)
	cut = func(e error) {
		switch e := e.(type) {
		case *fs.PathError:
			msg = strings.ReplaceAll(msg, e.Op+" "+e.Path+": ", e.Op+": ")
			msg = strings.ReplaceAll(msg, e.Path, "…")
		case *os.LinkError:
			msg = strings.ReplaceAll(msg, e.Op+" "+e.Old+" "+e.New+": ", e.Op+": ")
			msg = strings.ReplaceAll(strings.ReplaceAll(msg, e.Old, "…"), e.New, "…")
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			if next := u.Unwrap(); next != nil {
				cut(next)
			}
		case interface{ Unwrap() []error }:
			for _, next := range u.Unwrap() {
				cut(next)
			}
		}
	}
	cut(err)
	return msg
}

type errorString string

func (e errorString) Error() string { return string(e) }
