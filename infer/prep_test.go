package infer

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/jsonvalue"
	"github.com/doppel-dev/doppel/trace"
)

// streamInput is the tau traces with messy ones mixed in: a duplicate id, calls without answers,
// arguments that are not JSON, an unknown role.
func streamInput(t *testing.T) []trace.Trace {
	traces := append(loadTraces(t, "tau-retail-dev.json"), loadTraces(t, "tau-airline-dev.json")...)
	messy := fakeTrace("task-3/zz-messy",
		[3]string{"get_user_details", `{"user_id": `, `{"user_id": "x"`},
		[3]string{"get_user_details", `not json at all`, `ok`},
	)
	messy.Messages = append(messy.Messages,
		trace.Message{Role: trace.RoleAssistant, ToolCalls: []trace.ToolCall{{ID: "lost", Function: trace.Function{Name: "get_user_details", Arguments: `{"user_id": "u"}`}}}},
		trace.Message{Role: trace.RoleTool, ToolCallID: "ghost", Content: ptr("orphan")},
		trace.Message{Role: "narrator", Content: ptr("meanwhile")},
	)
	return append(traces, messy, traces[5], traces[40]) // two ids given twice
}

// A build from traces added in batches, in any order, equals Build of them all at once: bundle,
// report (warnings and their examples included) and self-check.
func TestBuildFromBatches(t *testing.T) {
	traces := streamInput(t)
	wantB, wantRep, err := Build(traces, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := marshalBuild(t, wantB.Marshal, wantRep)
	if len(wantRep.Warnings) < 5 {
		t.Fatalf("the messy traces gave only %v", wantRep.Warnings)
	}
	wantCheck, err := ReplayCheck(traces, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{1, 7, 100} {
		// The batches in a shuffled order, each batch's traces shuffled too.
		shuffled := append([]trace.Trace(nil), traces...)
		rng := rand.New(rand.NewPCG(uint64(size), 7))
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		var p Prepared
		var made [][]trace.Trace
		// Batches of 7 are loaded as a build activity loads them (AddAll: the next batch made while one is
		// added); the others one Add at a time.
		n := (len(shuffled) + size - 1) / size
		err := p.AddAll(context.Background(), n, func(_ context.Context, i int) ([]trace.Trace, error) {
			if i >= 2 {
				clear(made[i-2]) // added by now, and Prepared keeps nothing of a batch's slice
			}
			made = append(made, append([]trace.Trace(nil), shuffled[i*size:min((i+1)*size, len(shuffled))]...))
			return made[i], nil
		})
		if size != 7 {
			p = Prepared{}
			for i := 0; i < len(shuffled); i += size {
				batch := append([]trace.Trace(nil), shuffled[i:min(i+size, len(shuffled))]...)
				p.Add(batch)
				clear(batch)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		if p.Len() != len(traces)-2 {
			t.Fatalf("batches of %d: %d traces prepared, want %d", size, p.Len(), len(traces)-2)
		}
		b, rep, err := BuildFrom(&p, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := marshalBuild(t, b.Marshal, rep); got != want {
			t.Fatalf("batches of %d: the build differs from Build's", size)
		}
		// The same Prepared serves a second use (the self-check after the build).
		check, err := check(&p, Options{}, false, Resume{}, splitAuto)
		if err != nil {
			t.Fatal(err)
		}
		if a, b := marshalJSON(t, check), marshalJSON(t, wantCheck); a != b {
			t.Fatalf("batches of %d: the self-check differs", size)
		}
	}
}

// AddAll stops at the first error, next's or the context's, and answers it; the batches before it
// stay added and no batch past the failing one is asked for.
func TestAddAllStops(t *testing.T) {
	traces := loadTraces(t, "tau-retail-dev.json")[:6]
	boom := errors.New("blob gone")
	var p Prepared
	asked := 0
	err := p.AddAll(context.Background(), 6, func(_ context.Context, i int) ([]trace.Trace, error) {
		asked++
		if i == 3 {
			return nil, boom
		}
		return traces[i : i+1], nil
	})
	if !errors.Is(err, boom) || p.Len() != 3 || asked != 4 {
		t.Fatalf("err %v, %d prepared, %d asked; want %v, 3, 4", err, p.Len(), asked, boom)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p = Prepared{}
	err = p.AddAll(ctx, 6, func(_ context.Context, i int) ([]trace.Trace, error) {
		if i == 2 {
			cancel()
		}
		return traces[i : i+1], nil
	})
	if !errors.Is(err, context.Canceled) || p.Len() > 2 {
		t.Fatalf("cancelled: err %v, %d prepared; want context.Canceled, at most 2", err, p.Len())
	}
}

func marshalBuild(t *testing.T, bundle func() ([]byte, error), rep *Report) string {
	t.Helper()
	data, err := bundle()
	if err != nil {
		t.Fatal(err)
	}
	return string(data) + marshalJSON(t, rep)
}

func marshalJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// Objects of one shape share a Keys slice once prepared, objects whose key lists differ (even when
// their keys joined would read the same) do not, and changing one shared object leaves the others be.
func TestPreparedSharesKeyLists(t *testing.T) {
	tr := fakeTrace("task-1/share",
		[3]string{"get_order", `{"order_id": "#W1"}`, `{"order_id": "#W1", "status": "pending"}`},
		[3]string{"get_order", `{"order_id": "#W2"}`, `{"order_id": "#W2", "status": "delivered"}`},
		[3]string{"odd", `{"a\u0000": 1}`, `{"a": 1, "": 2}`},
		[3]string{"odd", `{"a": 1, "": 2}`, `{"b": 3}`},
	)
	var p Prepared
	p.Add([]trace.Trace{tr})
	cs := p.pts[0].calls
	a1, a2 := cs[0].val.(*jsonvalue.Object), cs[1].val.(*jsonvalue.Object)
	if &a1.Keys[0] != &a2.Keys[0] {
		t.Fatal("two answers of one shape keep separate key lists")
	}
	if &cs[0].args.Keys[0] != &cs[1].args.Keys[0] {
		t.Fatal("two argument objects of one shape keep separate key lists")
	}
	if odd := cs[2].args; odd.Len() != 1 || odd.Keys[0] != "a\x00" {
		t.Fatalf("keys [a\\x00] read as %q", odd.Keys)
	}
	if odd := cs[3].args; odd.Len() != 2 || odd.Keys[0] != "a" || odd.Keys[1] != "" {
		t.Fatalf("keys [a, \"\"] read as %q", odd.Keys)
	}
	a1.Delete("status")
	a1.Set("note", "x")
	if got := string(jsonvalue.Canonical(a2)); got != `{"order_id":"#W2","status":"delivered"}` {
		t.Fatalf("changing one object changed another of its shape: %s", got)
	}
	if got := string(jsonvalue.Canonical(a1)); got != `{"note":"x","order_id":"#W1"}` {
		t.Fatalf("changed object reads %s", got)
	}
}

// Calls with one answer text share its parsed tree, yet each counts as a call and warns on its own; a build
// releases the trees it is done with, and the Prepared's next use parses them again to the same build.
func TestPreparedSharesAnswers(t *testing.T) {
	product := `{"product_id": "P1", "name": "Lamp", "variants": {"1": {"price": 10.5}}}`
	traces := []trace.Trace{
		fakeTrace("task-1/a",
			[3]string{"get_product_details", `{"product_id": "P1"}`, product},
			[3]string{"get_product_details", `{"product_id": "P2"}`, `{broken`},
		),
		fakeTrace("task-2/b",
			[3]string{"get_product_details", `{"product_id": "P1"}`, product},
			[3]string{"get_product_details", `{"product_id": "P2"}`, `{broken`},
		),
	}
	var p Prepared
	p.Add(traces)
	first, again := p.pts[0].calls[0], p.pts[1].calls[0]
	if first.val == nil || first.val != again.val {
		t.Fatalf("one answer text parsed into two trees (%p, %p)", first.val, again.val)
	}
	b1, rep1, err := BuildFrom(&p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	warned := 0
	for _, w := range rep1.Warnings {
		if w.Code == "answer_not_json" {
			warned = w.Count
		}
	}
	if warned != 2 || rep1.NCalls != 4 {
		t.Fatalf("answer_not_json counted %d times over %d calls, want 2 over 4", warned, rep1.NCalls)
	}
	if !first.released || first.val != nil {
		t.Fatal("the build kept a parsed answer it was done with")
	}
	if _, _, err := p.finish(); err != nil {
		t.Fatal(err)
	}
	if first.val == nil || first.val != again.val {
		t.Fatal("the next use did not parse the released answers again into one shared tree")
	}
	b2, rep2, err := BuildFrom(&p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := marshalBuild(t, b1.Marshal, rep1), marshalBuild(t, b2.Marshal, rep2); a != b {
		t.Fatal("a second build from the same Prepared differs from the first")
	}
}

// Releasing answers as the build goes changes nothing it makes, past fit's trace horizon too.
func TestBuildReleaseKeepsBuild(t *testing.T) {
	defer func(n int) { maxFitTraces = n }(maxFitTraces)
	for _, horizon := range []int{10, 100, 100000} {
		maxFitTraces = horizon
		p := prepared(streamInput(t))
		pts, w, err := p.finish()
		if err != nil {
			t.Fatal(err)
		}
		want, wantRep, err := buildPrepared(pts, &Options{}, w, false)
		if err != nil {
			t.Fatal(err)
		}
		got, gotRep, err := BuildFrom(p, Options{})
		if err != nil {
			t.Fatal(err)
		}
		released := 0
		for _, pt := range pts {
			for _, c := range pt.calls {
				if c.released {
					released++
				}
			}
		}
		if released == 0 {
			t.Fatalf("horizon %d: the build released no answer", horizon)
		}
		got.Agent = nil
		if a, b := marshalBuild(t, got.Marshal, gotRep), marshalBuild(t, want.Marshal, wantRep); a != b {
			t.Fatalf("horizon %d: the build that released its answers differs from the one that kept them", horizon)
		}
	}
}

// A build reads its batches with ingest.DecodeBlobCalls, which leaves out the conversation's texts: the
// bundle (agent profile included), the report and the framework detected equal those of the whole traces.
func TestBuildFromLeanBlobs(t *testing.T) {
	traces := streamInput(t)
	wantB, wantRep, err := Build(traces, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var p Prepared
	var dropped int
	for i := 0; i < len(traces); i += 50 {
		full := &trace.Batch{Project: "p", Traces: traces[i:min(i+50, len(traces))]}
		blob, err := ingest.EncodeBlob(full)
		if err != nil {
			t.Fatal(err)
		}
		lean, err := ingest.DecodeBlobCalls(blob)
		if err != nil {
			t.Fatal(err)
		}
		for k := range lean.Traces {
			for j, m := range lean.Traces[k].Messages {
				if m.Content == nil && full.Traces[k].Messages[j].Content != nil {
					dropped++
				}
			}
		}
		if a, b := ingest.Detect(lean, ingest.Hints{}), ingest.Detect(full, ingest.Hints{}); a != b {
			t.Errorf("batch %d: detected %+v from the lean batch, %+v from the whole one", i/50, a, b)
		}
		p.Add(lean.Traces)
	}
	if dropped == 0 {
		t.Fatal("DecodeBlobCalls kept every text")
	}
	b, rep, err := BuildFrom(&p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if wantB.Agent == nil || len(wantB.Agent.Runs) == 0 {
		t.Fatal("the whole traces gave no agent runs to compare")
	}
	if got, want := marshalBuild(t, b.Marshal, rep), marshalBuild(t, wantB.Marshal, wantRep); got != want {
		t.Fatal("the build from lean batches differs from Build's")
	}
}
