package api_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	oteltrace "go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/internal/otlptest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/internal/tauformats"
)

// otlpTemplate is a real export body with the offsets of its trace ids and conversation ids, so that a request can
// be made of it with fresh ids by patching bytes in place (same lengths): every request's spans are new spans.
type otlpTemplate struct {
	body    []byte
	traceAt []int // offsets of the 16-byte trace ids
	convAt  []int // offsets of the last 7 bytes of each conversation id ("trial-0")
	spans   int
	convs   int
}

func newOTLPTemplate(b *testing.B, body []byte) otlpTemplate {
	req := &coltracepb.ExportTraceServiceRequest{}
	if err := proto.Unmarshal(body, req); err != nil {
		b.Fatal(err)
	}
	tm := otlpTemplate{body: body}
	ids, convs := map[string]bool{}, map[string]bool{}
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				tm.spans++
				ids[string(s.TraceId)] = true
				for _, kv := range s.Attributes {
					if kv.Key == "gen_ai.conversation.id" {
						convs[kv.Value.GetStringValue()] = true
					}
				}
			}
		}
	}
	tm.convs = len(convs)
	for id := range ids {
		for off := 0; ; {
			i := bytes.Index(body[off:], []byte(id))
			if i < 0 {
				break
			}
			tm.traceAt = append(tm.traceAt, off+i)
			off += i + len(id)
		}
	}
	for c := range convs {
		quoted := []byte(c)
		for off := 0; ; {
			i := bytes.Index(body[off:], quoted)
			if i < 0 {
				break
			}
			tm.convAt = append(tm.convAt, off+i+len(quoted)-7)
			off += i + len(quoted)
		}
	}
	return tm
}

// request appends request n's body: the template with its trace ids' last 8 bytes and its conversations' last 7
// characters made of n.
func (tm *otlpTemplate) request(dst []byte, n int) []byte {
	dst = append(dst[:0], tm.body...)
	for _, at := range tm.traceAt {
		binary.BigEndian.PutUint64(dst[at+8:], binary.BigEndian.Uint64(dst[at+8:])^uint64(n+1)*0x9E3779B97F4A7C15)
	}
	tag := fmt.Sprintf("%07d", n%10_000_000)
	for _, at := range tm.convAt {
		copy(dst[at:], tag)
	}
	return dst
}

// BenchmarkIngestOTLP measures OTLP/HTTP trace ingest beside collect and beside raw blob PUTs, in one run on one
// stack: 4 clients POST exports of the official SDK's exporter (its default 512 spans a request, tau retail's
// agent loop with GenAI content captured, protobuf; fresh trace and conversation ids each request) to /v1/traces;
// then, against the same server, batches of 50 tau traces to /api/collect; then PUTs of the export's size to the
// same blob store. Spans are staged in the database (the blob store is not touched until they settle); collect
// writes a blob and rows. Run with DOPPEL_TEST_POSTGRES and DOPPEL_TEST_S3 set for the production stack:
//
//	go test ./api -run '^$' -bench BenchmarkIngestOTLP -benchtime 40x
func BenchmarkIngestOTLP(b *testing.B) {
	const clients, perBatch = 4, 50
	traces, err := sampledata.Traces("retail")
	if err != nil {
		b.Fatal(err)
	}
	tools, err := tauformats.Tools("retail")
	if err != nil {
		b.Fatal(err)
	}
	bodies := otlptest.Bodies(b, "bench", func(tr oteltrace.Tracer) {
		for i, tt := range traces {
			tauformats.Emit(context.Background(), tr, tt, tauformats.EmitOptions{Conversation: tt.ID, Tools: tools, Start: time.Unix(int64(i)*3600, 0)})
		}
	})
	var tmpls []otlpTemplate
	for _, body := range bodies {
		if tm := newOTLPTemplate(b, body); tm.spans == 512 {
			tmpls = append(tmpls, tm)
		}
	}
	if len(tmpls) == 0 {
		b.Fatal("no full export of 512 spans")
	}
	// Collect bodies: 50 traces, each with a fresh id spliced in front of the rest of its encoding.
	rest := make([][]byte, len(traces))
	for i := range traces {
		enc := ingest.AppendTrace(nil, &traces[i])
		rest[i] = enc[len(`{"id":`)+len(strconv.Quote(traces[i].ID)):]
	}
	collectBodyOf := func(dst []byte, n int) []byte {
		dst = append(dst[:0], `{"project":"bench-collect","traces":[`...)
		for k := range perBatch {
			i := (n*perBatch + k) % len(traces)
			if k > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendQuote(append(dst, `{"id":`...), traces[i].ID+"#"+strconv.Itoa(n))
			dst = append(dst, rest[i]...)
		}
		return append(dst, "]}"...)
	}
	if out, err := exec.Command("uptime").Output(); err == nil {
		b.Logf("load before: %s", strings.TrimSpace(string(out)))
	}
	for _, be := range collectBackends {
		b.Run(be.name, func(b *testing.B) {
			serverGC(b)
			opts := api.CollectOptions{RatePerSecond: -1, MaxEnvBytes: 1 << 50}
			fx, _ := newTracesFx(b, be.driver, opts)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
			type phase struct {
				lat   []time.Duration
				bytes int64
				el    time.Duration
			}
			run := func(path, contentType string, want int, body func(dst []byte, n int) []byte) phase {
				var p phase
				var mu sync.Mutex
				var next atomic.Int64
				var wg sync.WaitGroup
				start := time.Now()
				for range clients {
					wg.Go(func() {
						var buf []byte
						for {
							n := int(next.Add(1)) - 1
							if n >= b.N {
								return
							}
							buf = body(buf, n)
							req, _ := http.NewRequest(http.MethodPost, fx.url+path, bytes.NewReader(buf))
							req.Header.Set("Authorization", "Bearer "+fx.key)
							req.Header.Set("Content-Type", contentType)
							t0 := time.Now()
							res, err := client.Do(req)
							if err != nil {
								b.Error(err)
								return
							}
							data, _ := io.ReadAll(res.Body)
							res.Body.Close()
							d := time.Since(t0)
							if res.StatusCode != want {
								b.Errorf("%s: %d %.300s", path, res.StatusCode, data)
								return
							}
							mu.Lock()
							p.lat = append(p.lat, d)
							p.bytes += int64(len(buf))
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				p.el = time.Since(start)
				slices.Sort(p.lat)
				return p
			}
			report := func(name string, p phase, units float64, unit string) {
				if len(p.lat) == 0 {
					return
				}
				b.ReportMetric(float64(p.bytes)/1e6/p.el.Seconds(), name+"_MB/s")
				b.ReportMetric(units/p.el.Seconds(), name+"_"+unit+"/s")
				b.ReportMetric(ms(latency.Percentile(p.lat, 50)), name+"_p50_ms")
				b.ReportMetric(ms(latency.Percentile(p.lat, 99)), name+"_p99_ms")
			}
			b.ResetTimer()
			cpu0 := processCPU()
			otlpPhase := run("/v1/traces", "application/x-protobuf", http.StatusOK, func(dst []byte, n int) []byte {
				tm := &tmpls[n%len(tmpls)]
				return tm.request(dst, n)
			})
			otlpCPU := processCPU() - cpu0
			cpu0 = processCPU()
			collectPhase := run("/api/collect", "application/json", http.StatusAccepted, collectBodyOf)
			collectCPU := processCPU() - cpu0
			b.StopTimer()
			spans, convs := 0, 0
			for i := range len(otlpPhase.lat) {
				spans += tmpls[i%len(tmpls)].spans
				convs += tmpls[i%len(tmpls)].convs
			}
			report("otlp", otlpPhase, float64(spans), "spans")
			b.ReportMetric(float64(convs)/otlpPhase.el.Seconds(), "otlp_convs/s")
			b.ReportMetric(otlpCPU.Seconds()*1000/(float64(otlpPhase.bytes)/1e6), "otlp_proc_cpu_ms/MB")
			report("collect", collectPhase, float64(len(collectPhase.lat)*perBatch), "traces")
			b.ReportMetric(collectCPU.Seconds()*1000/(float64(collectPhase.bytes)/1e6), "collect_proc_cpu_ms/MB")
			if all, pending := stagedCount(b, fx, "bench"); all != spans || pending != spans {
				b.Fatalf("%d spans staged (%d pending), want %d", all, pending, spans)
			}
			size := len(tmpls[0].body)
			mbps, p50 := measureConcurrentPuts(b, fx.blobs, size, clients, max(4, b.N/clients))
			b.ReportMetric(mbps, "put_export_MB/s")
			b.ReportMetric(p50, "put_export_p50_ms")
			b.ReportMetric(float64(size), "export_bytes")
			b.ReportMetric(float64(runtime.GOMAXPROCS(0)), "procs")
		})
	}
	if out, err := exec.Command("uptime").Output(); err == nil {
		b.Logf("load after: %s", strings.TrimSpace(string(out)))
	}
}
