package store_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
)

// latencies records per-operation durations and reports p50/p99 and throughput.
type latencies struct{ d []time.Duration }

func (l *latencies) time(fn func()) {
	t := time.Now()
	fn()
	l.d = append(l.d, time.Since(t))
}

func (l *latencies) report(b *testing.B, perOp int, unit string) {
	if len(l.d) == 0 {
		return
	}
	slices.Sort(l.d)
	p := func(q float64) time.Duration { return l.d[min(len(l.d)-1, int(q*float64(len(l.d))))] }
	var total time.Duration
	for _, d := range l.d {
		total += d
	}
	b.ReportMetric(float64(p(0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(p(0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(perOp*len(l.d))/total.Seconds(), unit+"/s")
}

func benchDrivers(b *testing.B, fn func(b *testing.B, db *bun.DB)) {
	for _, d := range schematest.Drivers() {
		b.Run(d, func(b *testing.B) { fn(b, schematest.Open(b, d)) })
	}
}

// One collect batch of 50 new traces (the collector's default batch size).
func BenchmarkInsertTraceBatch50(b *testing.B) {
	benchDrivers(b, func(b *testing.B, db *bun.DB) {
		ws, _ := store.CreateWorkspace(ctx, db, "bench")
		env, _ := store.UpsertEnvByProject(ctx, db, ws.ID, "bench")
		var lat latencies
		n := 0
		for b.Loop() {
			ids := make([]string, 50)
			for i := range ids {
				ids[i] = fmt.Sprintf("t%09d", n)
				n++
			}
			lat.time(func() {
				if _, err := store.InsertTraceBatch(ctx, db, &schema.TraceBatch{EnvID: env.ID, BlobKey: "k"}, ids); err != nil {
					b.Fatal(err)
				}
			})
		}
		lat.report(b, 50, "traces")
	})
}

// Resolving a bearer workspace key (every authenticated request does this).
func BenchmarkResolveKey(b *testing.B) {
	benchDrivers(b, func(b *testing.B, db *bun.DB) {
		ws, _ := store.CreateWorkspace(ctx, db, "bench")
		_, plain, err := store.CreateKey(ctx, db, ws.ID, cred.KindWorkspace, "bench")
		if err != nil {
			b.Fatal(err)
		}
		var lat latencies
		for b.Loop() {
			lat.time(func() {
				if _, _, err := store.ResolveKey(ctx, db, plain); err != nil {
					b.Fatal(err)
				}
			})
		}
		lat.report(b, 1, "resolves")
	})
}
