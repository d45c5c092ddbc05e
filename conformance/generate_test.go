package conformance

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// generators are the generated packages: each is regenerated into a temporary directory and must equal the
// committed one byte for byte, so the committed clients are the documents' (run `go generate` after the goldens
// change). Generating fails on any operation a generator cannot handle: no ignore list is configured.
var generators = []struct {
	dir  string
	args []string // go tool arguments; OUT is the output directory
}{
	{"ogen31", []string{"ogen", "-config", "ogen.yml", "-package", "ogen31", "-target", "OUT", "-clean", "../cmd/doppel/testdata/openapi-3.1.golden.json"}},
	{"ogen30", []string{"ogen", "-config", "ogen.yml", "-package", "ogen30", "-target", "OUT", "-clean", "../cmd/doppel/testdata/openapi-3.0.golden.json"}},
	{"oapi30", []string{"oapi-codegen", "-generate", "types,client", "-package", "oapi30", "-o", "OUT/client.gen.go", "../cmd/doppel/testdata/openapi-3.0.golden.json"}},
}

func TestGeneratedCodeCurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the generators")
	}
	for _, g := range generators {
		t.Run(g.dir, func(t *testing.T) {
			out := t.TempDir()
			args := []string{"tool"}
			for _, a := range g.args {
				args = append(args, strings.ReplaceAll(a, "OUT", out))
			}
			cmd := exec.Command("go", args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, tail(stderr.String(), 4000))
			}
			want, got := readTree(t, g.dir), readTree(t, out)
			if len(want) != len(got) {
				t.Errorf("%s: committed %v, generated %v (run go generate in conformance/)", g.dir, keys(want), keys(got))
			}
			for name, b := range got {
				if !bytes.Equal(want[name], b) {
					t.Errorf("%s/%s differs from what the generator writes now (run go generate in conformance/)", g.dir, name)
				}
			}
		})
	}
}

func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		rel, _ := filepath.Rel(dir, path)
		files[filepath.ToSlash(rel)] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
