package api_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/trace"
)

// BenchmarkCollect measures sustained ingest: concurrent clients POST batches of 50 real tau traces
// (ids made unique per request, so every trace is stored) over HTTP to /api/collect, on the GC target
// doppel's processes set (runtime.gc_percent). It reports body
// MB/s, traces/s and request latency p50/p99, and, measured right after in the same run against the
// same blob store, raw PUT throughput with the same concurrency for payloads of the body's size and
// of the stored blob's size (the blob store's limit). Issue 21's goal is 5,000 traces/s and 100 MB/s
// of body on PostgreSQL and MinIO with 4 clients. Run with DOPPEL_TEST_POSTGRES and DOPPEL_TEST_S3 set
// for the production stack:
//
//	go test ./api -run '^$' -bench BenchmarkCollect -benchtime 400x
func BenchmarkCollect(b *testing.B) {
	const clients, perBatch = 4, 50
	_, retail := readCollectData(b, "tau-retail-dev.json")
	_, airline := readCollectData(b, "tau-airline-dev.json")
	corpus := append(append([]trace.Trace(nil), retail.Traces...), airline.Traces...)
	// Each trace encoded once; a request splices a fresh id in front of the rest.
	rest := make([][]byte, len(corpus))
	for i := range corpus {
		enc := ingest.AppendTrace(nil, &corpus[i])
		rest[i] = enc[len(`{"id":`)+len(fmt.Sprintf("%q", corpus[i].ID)):]
	}
	// bodyOf appends request n's body to dst, each trace with a fresh id.
	bodyOf := func(dst []byte, n int) []byte {
		dst = append(dst, `{"project":"bench","traces":[`...)
		for k := range perBatch {
			i := (n*perBatch + k) % len(corpus)
			if k > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendQuote(append(dst, `{"id":`...), corpus[i].ID+"#"+strconv.Itoa(n))
			dst = append(dst, rest[i]...)
		}
		return append(dst, "]}"...)
	}
	for _, be := range collectBackends {
		b.Run(be.name, func(b *testing.B) {
			serverGC(b)
			// As doppel serve runs it: with its key cache.
			fx := newCollectServer(b, be.driver, api.CollectOptions{RatePerSecond: -1, MaxEnvBytes: 1 << 50}, nil, api.Options{KeyCacheTTL: api.DefaultKeyCacheTTL})
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
			var (
				mu        sync.Mutex
				lat       []time.Duration
				bodyBytes int64
				next      atomic.Int64
			)
			sample := bodyOf(nil, 0)
			b.SetBytes(int64(len(sample)))
			b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			start, cpu0, others0 := time.Now(), processCPU(), otherCPU()
			b.RunParallel(func(pb *testing.PB) {
				var mine []time.Duration
				var bytesSent int64
				var body []byte // a client's buffer serves its next request once the answer is in
				for pb.Next() {
					body = bodyOf(body[:0], int(next.Add(1)))
					req, _ := http.NewRequest(http.MethodPost, fx.url+"/api/collect", bytes.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+fx.key)
					req.Header.Set("Content-Type", "application/json")
					t0 := time.Now()
					res, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					data, _ := io.ReadAll(res.Body)
					res.Body.Close()
					mine = append(mine, time.Since(t0))
					if res.StatusCode != http.StatusAccepted || !bytes.Contains(data, []byte(`"accepted":50`)) {
						b.Errorf("%d %s", res.StatusCode, data)
						return
					}
					bytesSent += int64(len(body))
				}
				mu.Lock()
				lat = append(lat, mine...)
				bodyBytes += bytesSent
				mu.Unlock()
			})
			elapsed, cpu, others := time.Since(start), processCPU()-cpu0, otherCPU()
			b.StopTimer()
			if len(lat) == 0 {
				return
			}
			slices.Sort(lat)
			pct := func(p float64) float64 { return ms(latency.Percentile(lat, p)) }
			b.ReportMetric(float64(bodyBytes)/1e6/elapsed.Seconds(), "body_MB/s")
			b.ReportMetric(float64(len(lat)*perBatch)/elapsed.Seconds(), "traces/s")
			b.ReportMetric(pct(50), "p50_ms")
			b.ReportMetric(pct(99), "p99_ms")
			// CPU this process (server and clients, not the database or MinIO) spent per MB of body:
			// contention from other processes inflates wall time, much less this.
			b.ReportMetric(cpu.Seconds()*1000/(float64(bodyBytes)/1e6), "proc_cpu_ms/MB")
			// The same for PostgreSQL's and MinIO's processes when they run on this machine, and the machine's idle
			// share: on a machine with no idle CPU left, these say where it went.
			for _, name := range []string{"postgres", "minio"} {
				if d := others[name] - others0[name]; d > 0 {
					b.ReportMetric(d.Seconds()*1000/(float64(bodyBytes)/1e6), name+"_cpu_ms/MB")
				}
			}
			if all := others[cpuAll] - others0[cpuAll]; all > 0 {
				b.ReportMetric(100*float64(others[cpuIdle]-others0[cpuIdle])/float64(all), "idle_%")
				b.ReportMetric(100*float64(others[cpuSteal]-others0[cpuSteal])/float64(all), "steal_%")
			}
			if env := fx.env(b, "bench"); env.NTraces != int64(len(lat)*perBatch) {
				b.Fatalf("n_traces %d after %d batches of %d", env.NTraces, len(lat), perBatch)
			}

			// The blob store alone, same concurrency: PUTs of the body's size and of the blob's size.
			blobSize := 0
			if p, err := ingest.Decode(sample, ingest.Options{}); err == nil {
				if data, err := ingest.EncodeBlob(&p.Batch); err == nil {
					blobSize = len(data)
				}
			}
			for _, put := range []struct {
				name string
				size int
			}{{"put_body", len(sample)}, {"put_blob", blobSize}} {
				mbps, p50 := measureConcurrentPuts(b, fx.blobs, put.size, clients, max(8, len(lat)/clients))
				b.ReportMetric(mbps, put.name+"_MB/s")
				b.ReportMetric(p50, put.name+"_p50_ms")
				if put.name == "put_body" {
					// The traces/s the blob store alone would take if each batch were stored as its body.
					b.ReportMetric(mbps*1e6/float64(put.size)*perBatch, "put_body_traces/s")
				}
			}
			b.ReportMetric(float64(blobSize), "blob_bytes")
		})
	}
}

// measureConcurrentPuts PUTs perClient payloads of size bytes from each of clients goroutines and
// answers payload MB/s over the wall time and the p50 PUT latency in ms.
func measureConcurrentPuts(b *testing.B, s blob.Store, size, clients, perClient int) (float64, float64) {
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i*7 + i>>8)
	}
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			for i := range perClient {
				t0 := time.Now()
				key := fmt.Sprintf("rawput/%d/%d/%d", size, c, i)
				if err := s.Put(context.Background(), key, bytes.NewReader(payload), int64(size), "application/octet-stream"); err != nil {
					b.Error(err)
					return
				}
				d := time.Since(t0)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	if len(lat) == 0 {
		return 0, 0
	}
	slices.Sort(lat)
	return float64(len(lat)*size) / 1e6 / el.Seconds(), float64(lat[len(lat)/2].Microseconds()) / 1000
}

// processCPU is the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Keys of otherCPU beside process names: the machine's total CPU time, its idle time and the time its hypervisor
// gave other machines (steal).
const (
	cpuAll   = "(all)"
	cpuIdle  = "(idle)"
	cpuSteal = "(steal)"
)

// otherCPU answers the CPU time, children that ended included, of the processes named postgres and of those
// named minio on this machine, and the machine's total, idle and stolen CPU time (Linux's /proc; empty elsewhere).
func otherCPU() map[string]time.Duration {
	const tick = 10 * time.Millisecond // USER_HZ, 100 on Linux
	out := map[string]time.Duration{}
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range dirs {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: utime, stime, cutime and cstime are the 14th to 17th fields.
		open, end := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
		if open < 0 || end < open {
			continue
		}
		name := string(data[open+1 : end])
		if name != "postgres" && name != "minio" {
			continue
		}
		fields := strings.Fields(string(data[end+1:]))
		if len(fields) < 15 {
			continue
		}
		for _, v := range fields[11:15] {
			n, _ := strconv.ParseInt(v, 10, 64)
			out[name] += time.Duration(n) * tick
		}
	}
	if data, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := bytes.Cut(data, []byte("\n"))
		if fields := strings.Fields(string(line)); len(fields) > 5 && fields[0] == "cpu" {
			for i, v := range fields[1:] {
				n, _ := strconv.ParseInt(v, 10, 64)
				if i < 8 { // user nice system idle iowait irq softirq steal; guest time is in user already
					out[cpuAll] += time.Duration(n) * tick
				}
				switch i {
				case 3:
					out[cpuIdle] += time.Duration(n) * tick
				case 7:
					out[cpuSteal] += time.Duration(n) * tick
				}
			}
		}
	}
	return out
}
