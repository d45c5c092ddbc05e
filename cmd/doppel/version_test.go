package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

// versionOf names a build by its link-time version, module version or VCS stamp, never "(devel)".
func TestVersionOf(t *testing.T) {
	vcs := func(kv ...string) *debug.BuildInfo {
		bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/doppel-dev/doppel", Version: "(devel)"}}
		for i := 0; i < len(kv); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return bi
	}
	released := vcs()
	released.Main.Version = "v1.4.0"
	for _, c := range []struct {
		linked string
		bi     *debug.BuildInfo
		want   string
	}{
		{"v2.0.0", released, "v2.0.0 go1.26.8"},
		{"", released, "v1.4.0 go1.26.8"},
		{"", vcs("vcs.revision", "abcdef1234567890", "vcs.time", "2026-11-28T07:12:34Z", "vcs.modified", "false"), "v0.0.0-20261128071234-abcdef123456 go1.26.8"},
		{"", vcs("vcs.revision", "abcdef1234567890", "vcs.time", "2026-11-28T07:12:34Z", "vcs.modified", "true"), "v0.0.0-20261128071234-abcdef123456+dirty go1.26.8"},
		{"", vcs(), "v0.0.0-unknown (built without VCS information"},
	} {
		got := versionOf(c.linked, c.bi)
		if !strings.HasPrefix(got, c.want) || strings.Contains(got, "(devel)") {
			t.Errorf("versionOf(%q, %v) = %q, want it to start %q", c.linked, c.bi.Settings, got, c.want)
		}
	}
}
