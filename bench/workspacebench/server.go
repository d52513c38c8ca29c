//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
)

// buildBinaries builds cmd/kibotos-ctrl and cmd/kibotos-guest of the module
// in modRoot into dir, statically (the guest must run in any template; ctrl
// is built the same way as the brief's reference command).
func buildBinaries(ctx context.Context, modRoot, dir string) (ctrlBin, guestBin string, err error) {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", "./cmd/kibotos-ctrl", "./cmd/kibotos-guest")
	cmd.Dir = modRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("go build ./cmd/kibotos-ctrl ./cmd/kibotos-guest: %w\n%s", err, out.String())
	}
	return filepath.Join(dir, "kibotos-ctrl"), filepath.Join(dir, "kibotos-guest"), nil
}

// server is a running kibotos-ctrl --dev subprocess (with its embedded node
// agent) and its Prometheus listener.
type server struct {
	*benchkit.DevServer
	MetricsURL string
}

// startServer starts bin --dev --data-dir dataDir on a free loopback port,
// with a Prometheus listener on another, and waits until GetServerInfo
// answers over mutual TLS. It runs in its own process group: a Ctrl-C of the
// benchmark must not reach it, the benchmark deletes its workspaces through
// the API first.
func startServer(ctx context.Context, bin, guest, dataDir, logPath string) (*server, error) {
	mport, err := benchkit.FreePort()
	if err != nil {
		return nil, err
	}
	maddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(mport))
	ds, err := benchkit.StartDev(ctx, benchkit.DevOptions{Bin: bin, DataDir: dataDir, LogPath: logPath, OwnGroup: true,
		Args: []string{"--metrics-listen", maddr, "--guest-binary", guest}})
	if err != nil {
		return nil, err
	}
	return &server{DevServer: ds, MetricsURL: "http://" + maddr + "/metrics"}, nil
}

// metrics scrapes the server's Prometheus endpoint and returns the samples
// without labels (name → value).
func (s *server) metrics(ctx context.Context) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.MetricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, l := range strings.Split(string(b), "\n") {
		if l == "" || l[0] == '#' || strings.ContainsRune(l, '{') {
			continue
		}
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseFloat(f[1], 64); err == nil {
			out[f[0]] = v
		}
	}
	return out, nil
}
