package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"

	"golang.org/x/net/http2"

	"github.com/kibotos/kibotos/bench/internal/benchkit"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// buildServer builds cmd/kibotos-ctrl of the module in modRoot into dir, or
// with profiling its wrapper bench/ctrlprof.
func buildServer(ctx context.Context, modRoot, dir string, profiling bool) (string, error) {
	bin := filepath.Join(dir, "kibotos-ctrl")
	pkg := "./cmd/kibotos-ctrl"
	if profiling {
		pkg = "./bench/ctrlprof"
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	cmd.Dir = modRoot
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out.String())
	}
	return bin, nil
}

// egressClients hands out EgressService clients to workers: either one
// shared client (one HTTP/2 connection, multiplexed), or one client with its
// own connection per worker.
type egressClients struct {
	shared     ctrlv1connect.EgressServiceClient
	perWorker  []ctrlv1connect.EgressServiceClient
	transports []*http2.Transport
}

func newEgressClients(s *benchkit.DevServer, workers int, perWorker bool) (*egressClients, error) {
	ec := &egressClients{}
	n := 1
	if perWorker {
		n = workers
	}
	for range n {
		hc, tr, err := benchkit.NewHTTPClient(s.PKI)
		if err != nil {
			ec.close()
			return nil, err
		}
		ec.transports = append(ec.transports, tr)
		c := ctrlv1connect.NewEgressServiceClient(hc, s.URL)
		if perWorker {
			ec.perWorker = append(ec.perWorker, c)
		} else {
			ec.shared = c
		}
	}
	return ec, nil
}

func (ec *egressClients) get(w int) ctrlv1connect.EgressServiceClient {
	if ec.perWorker != nil {
		return ec.perWorker[w]
	}
	return ec.shared
}

func (ec *egressClients) close() {
	for _, t := range ec.transports {
		t.CloseIdleConnections()
	}
}
