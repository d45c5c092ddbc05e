package config

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeReference keeps the README's configuration table equal to Reference().
func TestReadmeReference(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const start, end = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"
	s := string(data)
	i, j := strings.Index(s, start), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatal("README.md lacks the config-reference markers")
	}
	if got := s[i+len(start) : j]; got != Reference() {
		if os.Getenv("DOPPEL_UPDATE_README") == "1" {
			if err := os.WriteFile("../README.md", []byte(s[:i+len(start)]+Reference()+s[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Error("README.md's configuration table is stale: run DOPPEL_UPDATE_README=1 go test ./config")
	}
}
