package journal

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
)

func report(b *testing.B, lat []time.Duration, elapsed time.Duration, st Stats) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "commits/s")
	b.ReportMetric(float64(latency.Percentile(lat, 50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(latency.Percentile(lat, 99).Microseconds()), "p99-µs")
	if st.Batches > 0 {
		b.ReportMetric(float64(st.Items)/float64(st.Batches), "calls/batch")
	}
	b.ReportMetric(0, "ns/op") // ns/op of a concurrent loop is misleading; the figures above are the result
}

type benchCase struct {
	name    string
	linger  time.Duration
	batch   int
	workers int
	tx      bool // explicit BEGIN … COMMIT around the batch's single INSERT
	calls   bool // NewCalls: the journal doppel runs (prepared single-row INSERTs in a transaction on SQLite)
	noYield bool // the leader takes its batch without first yielding to submitters that are ready to run
}

func (bc benchCase) writer(db *bun.DB) (*Writer[schema.Call], error) {
	if bc.calls {
		return NewCalls(db, CallOptions{MaxBatch: bc.batch, Linger: bc.linger, Workers: bc.workers, NoYield: bc.noYield})
	}
	return New(bc.options(db))
}

func (bc benchCase) options(db bun.IDB) Options[schema.Call] {
	o := Options[schema.Call]{DB: db, Insert: InsertCalls, MaxBatch: bc.batch, Linger: bc.linger, Workers: bc.workers, Direct: !bc.tx, NoYield: bc.noYield}
	return o
}

var benchCases = []benchCase{
	{"nogroup", 0, 1, 1, false, false, false}, // one transaction per call: the baseline group commit beats
	{"linger=0", 0, 256, 1, false, false, false},
	{"linger=0/tx", 0, 256, 1, true, false, false},
	{"linger=0/calls", 0, 256, 1, false, true, false},
	{"linger=1ms", time.Millisecond, 256, 1, false, false, false},
	{"linger=2ms", 2 * time.Millisecond, 256, 1, false, false, false},
	{"linger=0/workers=2", 0, 256, 2, false, false, false},
	{"linger=0/calls/noyield", 0, 256, 1, false, true, true},
}

func benchDB(b *testing.B, driver string) (*bun.DB, []string) {
	db := schematest.Open(b, driver)
	return db, seedSessions(b, db, 64)
}

// BenchmarkJournalClosedLoop: 64 submitters, each submitting its next call as soon as the last one
// committed (64 sessions of an agent loop), as fast as the database allows.
func BenchmarkJournalClosedLoop(b *testing.B) {
	for _, driver := range schematest.Drivers() {
		for _, bc := range benchCases {
			if driver == schema.DriverSQLite && bc.workers > 1 {
				continue
			}
			b.Run(driver+"/"+bc.name, func(b *testing.B) {
				db, sessions := benchDB(b, driver)
				w, err := bc.writer(db)
				if err != nil {
					b.Fatal(err)
				}
				const conc = 64
				var next atomic.Int64
				lats := make([][]time.Duration, conc)
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				for g := range conc {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var seq int64
						for next.Add(1) <= int64(b.N) {
							seq++
							t0 := time.Now()
							if err := w.Submit(context.Background(), call(sessions[g], seq)); err != nil {
								b.Error(err)
								return
							}
							lats[g] = append(lats[g], time.Since(t0))
						}
					}()
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				w.Close()
				var all []time.Duration
				for _, l := range lats {
					all = append(all, l...)
				}
				report(b, all, elapsed, w.Stats())
			})
		}
	}
}

// BenchmarkJournalRate: an open-loop load at a fixed rate (latency.Offer: calls arrive on schedule whether or not
// earlier ones committed, so queueing is not hidden); latency counts from each call's submission, and the load
// generator's own lag behind the schedule (Go's timers wake about 1 ms late on an idle machine) is reported
// apart.
func BenchmarkJournalRate(b *testing.B) {
	for _, driver := range schematest.Drivers() {
		for _, rate := range []int{1000, 5000} {
			for _, bc := range append(benchCases[1:7:7], benchCases[8]) {
				b.Run(fmt.Sprintf("%s/rate=%d/%s", driver, rate, bc.name), func(b *testing.B) {
					db, sessions := benchDB(b, driver)
					w, err := bc.writer(db)
					if err != nil {
						b.Fatal(err)
					}
					n := max(b.N, rate/2) // at least half a second of load
					lat := make([]time.Duration, n)
					lag := make([]time.Duration, n)
					seqs := make([]atomic.Int64, len(sessions))
					b.ResetTimer()
					start := time.Now()
					latency.Offer(context.Background(), rate, n, func(i int, due time.Time) {
						s := i % len(sessions)
						sent := time.Now()
						lag[i] = sent.Sub(due)
						if err := w.Submit(context.Background(), call(sessions[s], seqs[s].Add(1))); err != nil {
							b.Error(err)
						}
						lat[i] = time.Since(sent)
					})
					elapsed := time.Since(start)
					b.StopTimer()
					w.Close()
					b.ReportMetric(float64(latency.Percentile(latency.Sorted(lag), 99).Microseconds()), "lag-p99-µs")
					report(b, lat, elapsed, w.Stats())
				})
			}
		}
	}
}
