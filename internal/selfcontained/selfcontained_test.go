package selfcontained

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/internal/sampledata"
)

// TestRepository fails when any file of the repository names data outside it: a clone with nothing beside it
// must pass its own tests and run its quick start.
func TestRepository(t *testing.T) {
	root, err := sampledata.Root()
	if err != nil {
		t.Fatal(err)
	}
	found, err := Check(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("%s", f)
	}
}

// TestCheck runs the check on small trees that break the rule in each way it knows, and on one that does not.
func TestCheck(t *testing.T) {
	up, shared := ".."+"/", "shared"+"/"
	tests := []struct {
		name, file, text string
		want             string // a substring of the one finding; "" for none
	}{
		{"sibling shared dir in docs", "README.md", "go run ./cmd/doppel collect " + up + shared + "data/x.json\n", "names"},
		{"shared data dir", "run.sh", "cp -r shared" + "/data .\n", "names"},
		{"workspace path", "a/b_test.go", "package b\n\nvar p = \"/" + "work/" + shared + "x.json\"\n", "names"},
		{"home path in Go", "a/b_test.go", "package b\n\nimport \"os\"\n\nvar p, _ = os.ReadFile(\"/" + "home/me/traces.json\")\n", "absolute path"},
		{"relative literal climbing out", "a/b/c_test.go", "package c\n\nvar p = \"" + up + up + up + "data/x.json\"\n", "leaves the repository"},
		{"filepath.Join climbing out", "a/b/c_test.go", "package c\n\nimport \"path/filepath\"\n\nvar p = filepath.Join(\"..\", \"..\", \"..\", \"elsewhere\", \"x.json\")\n", "leaves the repository"},
		{"upload names are data", "a/b_test.go", "package b\n\nvar names = []string{\"" + up + up + up + "etc/passwd\"}\n", ""},
		{"inside the repository", "a/b/c_test.go", "package c\n\nimport \"path/filepath\"\n\nvar p = filepath.Join(\"..\", \"..\", \"docker\", \"twin.Dockerfile\")\nvar q = \"" + up + up + "testdata/x.json.gz\"\nvar s = \"/var/run/docker.sock\"\n", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			p := filepath.Join(root, filepath.FromSlash(tc.file))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(tc.text), 0o644); err != nil {
				t.Fatal(err)
			}
			found, err := Check(root)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.want == "" && len(found) != 0:
				t.Errorf("findings %v, want none", found)
			case tc.want != "" && (len(found) == 0 || !strings.Contains(found[0].What, tc.want)):
				t.Errorf("findings %v, want one saying %q", found, tc.want)
			}
		})
	}
}
