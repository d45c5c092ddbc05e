package docker_test

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/knadh/koanf/parsers/yaml"

	"github.com/doppel-dev/doppel/config"
)

// composeCLI is how to run Compose here: the docker CLI's plugin (`docker compose`) or the standalone
// docker-compose; nil when neither is installed.
func composeCLI() []string {
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}
	}
	if _, err := exec.LookPath("docker-compose"); err == nil {
		return []string{"docker-compose"}
	}
	return nil
}

// composeConfig runs `<compose> -f compose.yaml config` with the given variables (and no others of this process
// but PATH and HOME) and parses the resolved file.
func composeConfig(t *testing.T, cli []string, vars ...string) (map[string]any, error) {
	t.Helper()
	args := append(append([]string{}, cli[1:]...), "-f", "compose.yaml", "config")
	cmd := exec.Command(cli[0], args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, vars...)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		return nil, fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, stderr)
	}
	return yaml.Parser().Unmarshal(out)
}

// TestCompose validates compose.yaml with Compose itself (`config` resolves and checks the file; none of its
// images need to exist) and then checks what it asks of doppel: serve, worker and migrate run the service image,
// their environment is a configuration doppel accepts (config.Load, as the processes load it) on PostgreSQL, S3
// and Docker twins on a network they share, and the worker reaches the engine. The secrets are required: without
// them Compose refuses the file. Skipped where neither `docker compose` nor `docker-compose` is installed.
func TestCompose(t *testing.T) {
	cli := composeCLI()
	if cli == nil {
		t.Skip("neither the docker compose plugin nor docker-compose is installed")
	}
	if _, err := composeConfig(t, cli, "MINIO_ROOT_PASSWORD=m", "DOPPEL_CONSOLE_SECRET="+strings.Repeat("s", 32)); err == nil ||
		!strings.Contains(err.Error(), "POSTGRES_PASSWORD") {
		t.Errorf("without POSTGRES_PASSWORD: %v, want Compose to refuse the file naming it", err)
	}
	doc, err := composeConfig(t, cli, "POSTGRES_PASSWORD=pg-secret", "MINIO_ROOT_PASSWORD=minio-secret",
		"DOPPEL_CONSOLE_SECRET="+strings.Repeat("s", 32), "DOCKER_GID=998")
	if err != nil {
		t.Fatal(err)
	}
	services, _ := doc["services"].(map[string]any)
	for _, name := range []string{"postgres", "minio", "temporal", "migrate", "serve", "worker"} {
		if _, ok := services[name].(map[string]any); !ok {
			t.Errorf("no service %s", name)
		}
	}
	networks, _ := doc["networks"].(map[string]any)
	for _, name := range []string{"migrate", "serve", "worker"} {
		svc, _ := services[name].(map[string]any)
		if svc == nil {
			continue
		}
		if svc["image"] != "doppel-service:dev" {
			t.Errorf("%s: image %v, want doppel-service:dev", name, svc["image"])
		}
		if cmd := fmt.Sprint(svc["command"]); cmd != "["+name+"]" {
			t.Errorf("%s: command %s", name, cmd)
		}
		envMap, _ := svc["environment"].(map[string]any)
		var environ []string
		for k, v := range envMap {
			environ = append(environ, k+"="+fmt.Sprint(v))
		}
		slices.Sort(environ)
		cfg, err := config.Load(nil, environ)
		if err != nil {
			t.Errorf("%s: doppel refuses its environment: %v", name, err)
			continue
		}
		if cfg.DB.Driver != "postgres" || cfg.Blob.Driver != "s3" || cfg.Twin.Driver != "docker" || cfg.Temporal.Address != "temporal:7233" {
			t.Errorf("%s: db %s, blob %s, twins %s, temporal %q", name, cfg.DB.Driver, cfg.Blob.Driver, cfg.Twin.Driver, cfg.Temporal.Address)
		}
		net, _ := networks[cfg.Twin.Network].(map[string]any)
		if net == nil || net["name"] != cfg.Twin.Network {
			t.Errorf("%s: twin.docker_network %q is not a network of the file named so (%v)", name, cfg.Twin.Network, networks)
		}
		if joined, _ := svc["networks"].(map[string]any); joined == nil || !mapHas(joined, cfg.Twin.Network) {
			t.Errorf("%s: not on the twins' network %s (%v)", name, cfg.Twin.Network, svc["networks"])
		}
	}
	worker, _ := services["worker"].(map[string]any)
	if v := fmt.Sprint(worker["volumes"]); !strings.Contains(v, "/var/run/docker.sock:/var/run/docker.sock") {
		t.Errorf("worker volumes %s: the engine's socket is not mounted", v)
	}
	if g := fmt.Sprint(worker["group_add"]); g != "[998]" {
		t.Errorf("worker group_add %s, want the socket's group from DOCKER_GID", g)
	}
}

func mapHas(m map[string]any, k string) bool {
	_, ok := m[k]
	return ok
}
