package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/doppel-dev/doppel/config"
)

func runConfig(_ context.Context, e env) error {
	fmt.Fprintln(e.stdout, "Configuration: defaults, then a YAML file (--config or DOPPEL_CONFIG), then DOPPEL_* variables, then flags.")
	fmt.Fprintln(e.stdout)
	fmt.Fprint(e.stdout, config.Reference())
	return nil
}

// version is set at link time by a release build: go build -ldflags "-X main.version=v1.2.3" ./cmd/doppel.
var version string

func runVersion(_ context.Context, e env) error {
	bi, _ := debug.ReadBuildInfo()
	fmt.Fprintln(e.stdout, "doppel", versionOf(version, bi))
	return nil
}

// versionOf names the build: the link-time version; else the module's version (a `go install …@v1.2.3` build);
// else the VCS revision and time go build stamped (a build from a clone: a pseudo-version like Go's own,
// v0.0.0-20261128071234-abcdef123456, "+dirty" when the tree had changes); else "v0.0.0-unknown (built without VCS
// information: set -ldflags -X main.version, or build with -buildvcs=true)". The Go version and platform follow.
func versionOf(linked string, bi *debug.BuildInfo) string {
	v := linked
	goVersion := runtime.Version()
	if bi != nil {
		goVersion = bi.GoVersion
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		if v == "" {
			var rev, at string
			dirty := false
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.time":
					at = s.Value
				case "vcs.modified":
					dirty = s.Value == "true"
				}
			}
			if rev != "" {
				if len(rev) > 12 {
					rev = rev[:12]
				}
				stamp := "00000000000000"
				if t, err := time.Parse(time.RFC3339, at); err == nil {
					stamp = t.UTC().Format("20060102150405")
				}
				v = "v0.0.0-" + stamp + "-" + rev
				if dirty {
					v += "+dirty"
				}
			}
		}
	}
	if v == "" {
		v = "v0.0.0-unknown (built without VCS information: set -ldflags \"-X main.version=…\" or build with -buildvcs=true)"
	}
	return fmt.Sprintf("%s %s %s/%s", v, goVersion, runtime.GOOS, runtime.GOARCH)
}
