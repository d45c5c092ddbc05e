package config

import (
	"os"
	"strings"
	"testing"
)

// referenceDoc is the configuration reference; its table between the config-reference markers is Reference().
const referenceDoc = "../docs/configuration.md"

// TestConfigurationReference keeps the documented configuration table equal to Reference().
func TestConfigurationReference(t *testing.T) {
	data, err := os.ReadFile(referenceDoc)
	if err != nil {
		t.Fatal(err)
	}
	const start, end = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"
	s := string(data)
	i, j := strings.Index(s, start), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the config-reference markers", referenceDoc)
	}
	if got := s[i+len(start) : j]; got != Reference() {
		if os.Getenv("DOPPEL_UPDATE_DOCS") == "1" {
			if err := os.WriteFile(referenceDoc, []byte(s[:i+len(start)]+Reference()+s[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("%s's configuration table is stale: run DOPPEL_UPDATE_DOCS=1 go test ./config", referenceDoc)
	}
}
