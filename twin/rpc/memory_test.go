package rpc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/internal/osmem"
	"github.com/doppel-dev/doppel/twin"
)

// notesRuntime is a real twin runtime over a bundle whose provided tool put_note stores a note row in the session's
// world: each session holds what it wrote.
func notesRuntime(t *testing.T) Runtime {
	t.Helper()
	const put = `
def handle(args):
    world.put("notes", args["id"], {"id": args["id"], "text": args["text"]})
    return {"stored": args["id"]}
`
	b := &twin.Bundle{Format: twin.FormatVersion, SchemaSource: "provided",
		Tools: []twin.Tool{{Name: "put_note", Binding: twin.BindingProvided, Rung: twin.RungProvided, Kind: twin.KindWrite,
			Provided: put, Table: "notes", KeyArg: "id",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"id":{"type":"string"},"text":{"type":"string"}},"required":["id","text"]}`)}},
		Tables: []twin.Table{{Name: "notes", Key: "id", KeyInRow: true, Rows: []twin.Row{{Key: "n0", JSON: `{"id": "n0", "text": ""}`}}}},
	}
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	rt, err := NewTwinRuntime(data, twin.RuntimeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// rss is the process's resident set in bytes (Linux).
func rss(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skipf("no /proc/self/statm: %v", err)
	}
	f := strings.Fields(string(b))
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return pages * int64(os.Getpagesize())
}

// fill opens n sessions on srv, each writing a note of size bytes into its world.
func fill(t *testing.T, srv *Server, n, size int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		id := fmt.Sprintf("ses_%06d", i)
		if _, err := srv.OpenSession(ctx, OpenRequest{ID: id}); err != nil {
			t.Fatal(err)
		}
		// A fresh text per session (the arguments are parsed into the world's row).
		text := strings.Repeat(string(rune('a'+i%26)), size-8) + fmt.Sprintf("%08d", i)
		args, _ := json.Marshal(map[string]string{"id": "n1", "text": text})
		if _, err := srv.CallSession(ctx, id, CallRequest{Tool: "put_note", Arguments: args}); err != nil {
			t.Fatal(err)
		}
	}
}

func closeAll(t *testing.T, srv *Server, n int) {
	t.Helper()
	for i := range n {
		if existed, err := srv.CloseSession(fmt.Sprintf("ses_%06d", i)); err != nil || !existed {
			t.Fatalf("close %d: %v %v", i, existed, err)
		}
	}
}

const mib = 1 << 20

// After a mass close the twin gives the worlds' memory back to the OS (issue 33): 1,724 sessions holding 32 KiB each
// are closed; without a returner the heap is collected but the process keeps its pages (the figure is logged), with
// one the resident set falls back near where it was before the sessions opened.
func TestMassCloseReturnsMemory(t *testing.T) {
	const n, size = 1724, 32 << 10
	rt := notesRuntime(t)
	settle := func() int64 {
		debug.FreeOSMemory()
		return rss(t)
	}

	// Without a returner: what the process keeps after the closes and a collection.
	base := settle()
	plain := NewServer(ServerOptions{})
	plain.SetRuntime(rt)
	fill(t, plain, n, size)
	runtime.GC()
	peak := rss(t)
	closeAll(t, plain, n)
	runtime.GC()
	time.Sleep(time.Second) // the runtime's background scavenger's chance
	kept := rss(t)

	// With one: the closes return the memory, in one return or a few (rate-limited): the test waits for one that
	// began after the last close.
	base2 := settle()
	returns := make(chan time.Time, 64)
	ret := osmem.New(200*time.Millisecond, func() { began := time.Now(); debug.FreeOSMemory(); returns <- began })
	defer ret.Stop()
	srv := NewServer(ServerOptions{Memory: ret})
	srv.SetRuntime(rt)
	fill(t, srv, n, size)
	runtime.GC()
	peak2 := rss(t)
	closeAll(t, srv, n)
	closed := time.Now()
	for waiting := true; waiting; {
		select {
		case began := <-returns:
			waiting = began.Before(closed)
		case <-time.After(30 * time.Second):
			t.Fatal("closing every session returned no memory to the OS")
		}
	}
	after := rss(t)
	t.Logf("%d sessions × %d KiB: RSS base %d MiB → peak %d MiB → after closes and a GC %d MiB (no return); "+
		"base %d MiB → peak %d MiB → after closes with the return %d MiB",
		n, size>>10, base/mib, peak/mib, kept/mib, base2/mib, peak2/mib, after/mib)
	if grown := peak2 - base2; grown < 32*mib {
		t.Fatalf("the sessions grew the RSS by only %d MiB: nothing to measure", grown/mib)
	}
	if after-base2 > (peak2-base2)/4 {
		t.Errorf("after the return RSS is %d MiB over its base of %d MiB (peak %d MiB): want most of the growth returned",
			(after-base2)/mib, base2/mib, peak2/mib)
	}
}
