package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/schema"
)

// BenchmarkMCPCallRate: tools/call over MCP (the official SDK's client on Streamable HTTP) in MCP sessions of a
// session-based version (/mcp/envs/{slug}) and at the stateless revision 2026-07-28 (a session's own address,
// mcp_url), beside the REST call (POST /v1/sessions/{id}/call), at the same fixed rate in one run, each over 64
// sessions seeded alike, replaying tau-retail's recorded calls through the in-process twin over its HTTP RPC, journaled to SQLite.
// Latency is from each call's send; the generator's lag is reported apart. keycache=0s reads the MCP token from the
// database on every request (the REST call's session token has a cache of its own either way); keycache=5s caches
// it as doppel serve and dev do.
func BenchmarkMCPCallRate(b *testing.B) {
	for _, rate := range []int{500} {
		for _, keyTTL := range []time.Duration{0, api.DefaultKeyCacheTTL} {
			b.Run(fmt.Sprintf("sqlite/rate=%d/keycache=%s", rate, keyTTL), func(b *testing.B) { benchMCPCallRate(b, rate, keyTTL) })
		}
	}
}

func benchMCPCallRate(b *testing.B, rate int, keyTTL time.Duration) {
	serverGC(b)
	bundle, traces := retailBundle(b)
	p := newMCPPlaneKeyCache(b, schema.DriverSQLite, bundle, keyTTL)
	work := workload(traces)
	type mcpCall struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	hc := loadClient()
	mcpClient := &http.Client{Transport: withBearer{p.key, hc.Transport}}
	rest := make([]*loadTarget, 64)
	sessions := make([]*mcp.ClientSession, 64)
	stateless := make([]*mcp.ClientSession, 64)
	mcpCalls := make([][]mcpCall, 64)
	for i := range rest {
		s := p.open(map[string]any{"seed": i})
		rest[i] = &loadTarget{url: p.srv.URL + "/v1/sessions/" + s.ID + "/call", token: s.Token, calls: work[i%len(work)]}
		// The stateless revision at a session's own address, in a session of its own seeded alike.
		own := p.open(map[string]any{"seed": i})
		sc := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
		scs, err := sc.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: str(own.Open["mcp_url"]),
			HTTPClient: &http.Client{Transport: withBearer{own.Token, hc.Transport}}}, nil)
		if err != nil {
			b.Fatal(err)
		}
		if v := scs.InitializeResult().ProtocolVersion; v != api.MCPStatelessVersion {
			b.Fatalf("the session address negotiated %s", v)
		}
		b.Cleanup(func() { _ = scs.Close() })
		stateless[i] = scs
		c := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
		cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
			Endpoint: p.srv.URL + "/mcp/envs/" + p.env.Slug + "?seed=" + strconv.Itoa(i), HTTPClient: mcpClient}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cs.Close() })
		sessions[i] = cs
		for _, body := range work[i%len(work)] {
			var mc mcpCall
			_ = json.Unmarshal(body, &mc)
			mcpCalls[i] = append(mcpCalls[i], mc)
		}
	}
	var next, nextStateless [64]atomic.Int64
	sendREST := func(i int) (int, error) {
		t := rest[i%len(rest)]
		return post(hc, t.url, t.token, t.body())
	}
	sendOn := func(css []*mcp.ClientSession, next *[64]atomic.Int64) func(int) (int, error) {
		return func(i int) (int, error) {
			k := i % len(css)
			calls := mcpCalls[k]
			mc := calls[int(next[k].Add(1)-1)%len(calls)]
			res, err := css[k].CallTool(context.Background(), &mcp.CallToolParams{Name: mc.Name, Arguments: mc.Arguments})
			if err != nil {
				return 0, err
			}
			if res.Meta[api.MetaCall] == nil {
				return 0, fmt.Errorf("no call _meta: %+v", res)
			}
			return http.StatusOK, nil
		}
	}
	sendMCP, sendStateless := sendOn(sessions, &next), sendOn(stateless, &nextStateless)
	n := max(b.N, 5*rate)                         // at least five seconds of load each
	_, _, _, _ = openLoop(rate/2, rate, sendREST) // warm the pools and the twin's indexes
	_, _, _, _ = openLoop(rate/2, rate, sendMCP)
	_, _, _, _ = openLoop(rate/2, rate, sendStateless)
	b.ResetTimer()
	restLat, restBad, restErrs, restLag := openLoop(n, rate, sendREST)
	mcpLat, mcpBad, mcpErrs, mcpLag := openLoop(n, rate, sendMCP)
	slLat, slBad, slErrs, slLag := openLoop(n, rate, sendStateless)
	b.StopTimer()
	if restBad > 0 || mcpBad > 0 || slBad > 0 {
		b.Errorf("failed calls: REST %d (%q), MCP sessions %d (%q), MCP %s %d (%q)", restBad, restErrs, mcpBad, mcpErrs,
			api.MCPStatelessVersion, slBad, slErrs)
	}
	b.ReportMetric(ms(latency.Percentile(restLat, 50)), "rest-p50-ms")
	b.ReportMetric(ms(latency.Percentile(restLat, 99)), "rest-p99-ms")
	b.ReportMetric(ms(latency.Percentile(mcpLat, 50)), "mcp-p50-ms")
	b.ReportMetric(ms(latency.Percentile(mcpLat, 99)), "mcp-p99-ms")
	b.ReportMetric(ms(latency.Percentile(slLat, 50)), "mcp2026-p50-ms")
	b.ReportMetric(ms(latency.Percentile(slLat, 99)), "mcp2026-p99-ms")
	lag := max(latency.Percentile(restLag, 99), latency.Percentile(mcpLag, 99), latency.Percentile(slLag, 99))
	b.ReportMetric(ms(lag), "lag-p99-ms")
	b.ReportMetric(0, "ns/op")
}
