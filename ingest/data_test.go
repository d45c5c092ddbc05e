package ingest

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/trace"
)

// readData reads a file of recorded traces in the collect body format from the repository's testdata/.
func readData(t testing.TB, name string) []byte {
	t.Helper()
	return sampledata.MustRead(t, name)
}

var dataFiles = []struct {
	file, project, slug string
	traces, calls       int
}{
	{"tau-retail-dev.json", "tau2-retail", "tau2-retail", 126, 960},
	{"tau-airline-dev.json", "tau-airline", "tau-airline", 148, 941},
	{"bfcl-multi-turn-dev.json", "bfcl-multi-turn", "bfcl-multi-turn", 268, 1573},
}

func TestDecodeRealTraces(t *testing.T) {
	for _, tc := range dataFiles {
		t.Run(tc.file, func(t *testing.T) {
			body := readData(t, tc.file)
			got, err := Decode(body, Options{})
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			var want trace.Batch
			if err := json.Unmarshal(body, &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Batch, want) {
				t.Fatalf("Decode differs from encoding/json")
			}
			if got.Batch.Project != tc.project || got.Slug != tc.slug || len(got.Batch.Traces) != tc.traces || got.Calls != tc.calls {
				t.Errorf("project %q slug %q traces %d calls %d; want %q %q %d %d",
					got.Batch.Project, got.Slug, len(got.Batch.Traces), got.Calls, tc.project, tc.slug, tc.traces, tc.calls)
			}
			blob, err := EncodeBlob(&got.Batch)
			if err != nil {
				t.Fatal(err)
			}
			back, err := DecodeBlob(blob)
			if err != nil {
				t.Fatalf("DecodeBlob: %v", err)
			}
			if !reflect.DeepEqual(*back, want) {
				t.Fatalf("blob round trip differs")
			}
			t.Logf("%d bytes -> blob %d bytes (%.1f%%), %d tools %v", len(body), len(blob), 100*float64(len(blob))/float64(len(body)), len(got.Tools), got.Tools)
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	body := readData(b, "tau-retail-dev.json")
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := Decode(body, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeBlob(b *testing.B) {
	body := readData(b, "tau-retail-dev.json")
	p, err := Decode(body, Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := EncodeBlob(&p.Batch); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendJSON(b *testing.B) {
	body := readData(b, "tau-retail-dev.json")
	p, err := Decode(body, Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	buf := make([]byte, 0, len(body))
	for b.Loop() {
		buf = AppendJSON(buf[:0], &p.Batch)
	}
}

func BenchmarkCheck(b *testing.B) {
	body := readData(b, "tau-retail-dev.json")
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := Check(body, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
