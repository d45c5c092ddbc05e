package api_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/internal/hooktest"
	"github.com/doppel-dev/doppel/internal/latency"
	"github.com/doppel-dev/doppel/internal/testenv"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/webhook"
	"github.com/doppel-dev/doppel/worker"
	"github.com/doppel-dev/doppel/workflows"
	"github.com/doppel-dev/doppel/workflows/wfclient"
)

// hookRig is a webhook endpoint on a local receiver with a Temporal worker (DOPPEL_TEST_TEMPORAL) delivering to it.
type hookRig struct {
	rcv   *hooktest.Receiver
	hooks *wfclient.Webhooks
	ep    *schema.WebhookEndpoint
}

func newHookRig(tb testing.TB, p *plane) *hookRig {
	tb.Helper()
	c, err := client.Dial(client.Options{HostPort: testenv.Temporal(tb), Logger: log.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	rig := &hookRig{rcv: hooktest.NewReceiver()}
	tb.Cleanup(rig.rcv.Close)
	allow, _ := webhook.ParseCIDRs([]string{"127.0.0.0/8"})
	queue := "bench-hooks-" + schema.NewID("")
	rig.hooks = &wfclient.Webhooks{Conn: wfclient.Conn{Client: c, TaskQueue: queue},
		Dispatched: func(ctx context.Context, ids []string) error { return store.MarkDispatched(ctx, p.db, ids) },
		Policy:     workflows.DeliveryPolicy{Initial: 200 * time.Millisecond, Max: time.Second}}
	w := sdkworker.New(c, queue, sdkworker.Options{})
	worker.Register(w, worker.Deps{Webhooks: &activities.Webhooks{DB: p.db, Sender: webhook.NewSender(&webhook.Guard{Allow: allow}, 5*time.Second), Dispatch: rig.hooks}})
	if err := w.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(w.Stop)
	rig.ep = &schema.WebhookEndpoint{WorkspaceID: p.ws.ID, URL: rig.rcv.URL, Secret: webhook.NewSecret()}
	if err := store.CreateEndpoint(context.Background(), p.db, rig.ep); err != nil {
		tb.Fatal(err)
	}
	rig.rcv.SetSecret(rig.ep.Secret)
	return rig
}

// BenchmarkOpenEvents: the added latency of recording session.opened on the session-open path. Seeded opens one
// after another on a warm in-process twin (the open workflow's activities run directly), with events off, with
// events recorded but no endpoint, and with an endpoint whose deliveries a Temporal worker in this process runs
// meanwhile (DOPPEL_TEST_TEMPORAL; skipped without it). The modes run in the same invocation, one beside another.
func BenchmarkOpenEvents(b *testing.B) {
	for _, driver := range schematest.Drivers() {
		for _, mode := range []string{"off", "events", "webhook"} {
			b.Run(driver+"/"+mode, func(b *testing.B) {
				serverGC(b)
				bundle, _ := retailBundle(b)
				ev := &activities.EventLog{}
				o := planeOptions{local: true}
				if mode != "off" {
					o.events = ev
				}
				p := newPlane(b, driver, bundle, o)
				ev.DB = p.db
				var rig *hookRig
				if mode == "webhook" {
					rig = newHookRig(b, p)
					ev.Dispatch = rig.hooks
				}
				srv := httptest.NewServer(p.h)
				b.Cleanup(srv.Close)
				hc := loadClient()
				url := srv.URL + "/v1/envs/" + p.env.Slug + "/sessions"
				_ = seededOpens(b, hc, url, p.key, 20) // warm the twin and the connections
				n := max(b.N, 300)
				b.ResetTimer()
				lat := seededOpens(b, hc, url, p.key, n)
				b.StopTimer()
				b.ReportMetric(ms(latency.Percentile(lat, 50)), "p50-ms")
				b.ReportMetric(ms(latency.Percentile(lat, 99)), "p99-ms")
				b.ReportMetric(0, "ns/op")
				if rig != nil {
					if _, ok := rig.rcv.Wait(2*time.Minute, func(got []hooktest.Message) bool { return len(got) >= n+20 }); !ok {
						b.Fatalf("%d of %d session.opened events delivered", len(rig.rcv.Messages()), n+20)
					}
				}
			})
		}
	}
}

// BenchmarkWebhookDelivery: events per second delivered to a local receiver through the delivery workflows on a
// real Temporal server (DOPPEL_TEST_TEMPORAL), from a burst of recorded events, beside the baseline of the same
// number of signed POSTs sent straight to the receiver by the same sender, 8 at a time.
func BenchmarkWebhookDelivery(b *testing.B) {
	for _, driver := range schematest.Drivers() {
		b.Run(driver, func(b *testing.B) {
			bundle, _ := retailBundle(b)
			p := newPlane(b, driver, bundle, planeOptions{local: true})
			rig := newHookRig(b, p)
			ctx := context.Background()
			n := max(b.N, 300)
			var ids []string
			for i := range n {
				ev, err := store.NewEvent(p.ws.ID, events.SessionOpened, fmt.Sprint("ses_", i), "", events.SessionData{SessionID: fmt.Sprint("ses_", i)})
				if err != nil {
					b.Fatal(err)
				}
				d, err := store.RecordEvent(ctx, p.db, ev)
				if err != nil || len(d) != 1 {
					b.Fatalf("record: %v %v", d, err)
				}
				ids = append(ids, d...)
			}
			b.ResetTimer()
			began := time.Now()
			var wg sync.WaitGroup
			const par = 8
			for k := range par {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var mine []string
					for i := k; i < len(ids); i += par {
						mine = append(mine, ids[i])
					}
					if err := rig.hooks.Dispatch(ctx, mine); err != nil {
						b.Error(err)
					}
				}()
			}
			wg.Wait()
			got, ok := rig.rcv.Wait(5*time.Minute, func(got []hooktest.Message) bool { return len(got) >= n })
			took := time.Since(began)
			b.StopTimer()
			if !ok {
				b.Fatalf("%d of %d delivered", len(got), n)
			}
			var lat []time.Duration
			for _, m := range got {
				if m.Err != nil {
					b.Fatalf("signature: %v", m.Err)
				}
			}
			// Baseline: the same count of signed POSTs straight to the receiver, 8 at a time.
			allow, _ := webhook.ParseCIDRs([]string{"127.0.0.0/8"})
			sender := webhook.NewSender(&webhook.Guard{Allow: allow}, 5*time.Second)
			body := []byte(`{"id":"evt_x","type":"session.opened","data":{}}`)
			rawBegan := time.Now()
			var mu sync.Mutex
			for k := range par {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := k; i < n; i += par {
						t0 := time.Now()
						res := sender.Send(ctx, webhook.Request{URL: rig.rcv.URL, Secret: rig.ep.Secret, ID: "evt_x", Timestamp: time.Now(), Body: body})
						mu.Lock()
						lat = append(lat, time.Since(t0))
						mu.Unlock()
						if !res.OK() {
							b.Errorf("baseline send: %+v", res)
						}
					}
				}()
			}
			wg.Wait()
			raw := time.Since(rawBegan)
			lat = latency.Sorted(lat)
			b.ReportMetric(float64(n)/took.Seconds(), "events/s")
			b.ReportMetric(float64(n)/raw.Seconds(), "raw-events/s")
			b.ReportMetric(ms(latency.Percentile(lat, 50)), "raw-p50-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}
