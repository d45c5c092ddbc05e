package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/twin/rpc/rpctest"
)

// Built once by TestMain.
var (
	// twinBinary runs "twin --listen ADDR --bundle FILE": DOPPEL_TEST_TWIN_BINARY (a doppel binary), else a build
	// of ./internal/twinmain (static, so it also serves as the test image's binary).
	twinBinary string
	// bankPath holds the small real bundle bankBundle makes.
	bankPath string
	bankData []byte
	// testDir is removed when the tests end.
	testDir string
)

func TestMain(m *testing.M) {
	code, err := setup(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "driver tests:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func setup(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "doppel-driver-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	testDir = dir
	twinBinary = os.Getenv("DOPPEL_TEST_TWIN_BINARY")
	if twinBinary == "" {
		twinBinary = filepath.Join(dir, "doppel")
		cmd := exec.Command("go", "build", "-trimpath", "-o", twinBinary, "./internal/twinmain")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("build twinmain: %v\n%s", err, out)
		}
	}
	if bankData, err = rpctest.BankBundle(); err != nil {
		return 0, err
	}
	bankPath = filepath.Join(dir, "bank.bundle.json")
	if err := os.WriteFile(bankPath, bankData, 0o644); err != nil {
		return 0, err
	}
	return m.Run(), nil
}

func bankSpec(env string) Spec {
	return Spec{EnvID: env, BuildID: "bld_1", BundlePath: bankPath, BundleHash: twin.HashBytes(bankData)}
}

// dirBlobs reads blobs from files under a directory, as blob.NewLocal stores them.
type dirBlobs string

func (d dirBlobs) Get(_ context.Context, key string) (io.ReadCloser, error) {
	return os.Open(filepath.Join(string(d), filepath.FromSlash(key)))
}

// session drives one session on a twin and keeps its journal, as the API does.
type session struct {
	id      string
	spec    rpc.SessionSpec
	journal []rpc.JournalEntry
}

func (s *session) call(t testing.TB, c *rpc.Client, tool, args string) rpc.CallResult {
	t.Helper()
	res, err := c.Call(context.Background(), s.id, rpc.CallRequest{Tool: tool, Arguments: json.RawMessage(args)})
	if err != nil {
		t.Fatalf("call %s %s: %v", tool, args, err)
	}
	s.journal = append(s.journal, rpc.JournalEntry{Tool: tool, Arguments: json.RawMessage(args), Content: res.Content,
		Error: res.Error, Fidelity: res.Fidelity, Rung: res.Rung, StateHash: res.StateHash})
	return res
}

func (s *session) lastHash() string { return s.journal[len(s.journal)-1].StateHash }

func mustInspect(t testing.TB, d Driver, h Handle) Status {
	t.Helper()
	st, err := d.Inspect(context.Background(), h)
	if err != nil {
		t.Fatalf("Inspect %s: %v", h.ID, err)
	}
	return st
}
