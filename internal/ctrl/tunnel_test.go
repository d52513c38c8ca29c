package ctrl

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	guestv1 "github.com/kibotos/kibotos/gen/kibotos/guest/v1"
	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
	"github.com/kibotos/kibotos/internal/pki"
	"github.com/kibotos/kibotos/internal/tunnel"
)

// openTunnel asks for a tunnel over HTTP/1.1 with the given certificate
// and returns the answer's status.
func openTunnel(t *testing.T, base string, p pki.DevPaths, cert, key string) int {
	t.Helper()
	tlsc, err := pki.ClientConfig(p.CA, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	tlsc.NextProtos = []string{"http/1.1"}
	u, _ := url.Parse(base)
	conn, err := tls.Dial("tcp", u.Host, tlsc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nUpgrade: %s\r\nConnection: Upgrade\r\nContent-Length: 0\r\n\r\n", tunnel.Path, u.Host, tunnel.Protocol)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// TestTunnelAdmission: a node certificate opens a data tunnel; an operator
// certificate, none, or a node certificate whose key was denied cannot.
func TestTunnelAdmission(t *testing.T) {
	srv, base, p := serve(t)
	dir := t.TempDir()
	node, nodeKey := dir+"/node.pem", dir+"/node-key.pem"
	if err := pki.IssueClient(p.CA, p.CAKey, "node-1", pki.RoleNode, time.Hour, node, nodeKey); err != nil {
		t.Fatal(err)
	}
	if got := openTunnel(t, base, p, node, nodeKey); got != http.StatusSwitchingProtocols {
		t.Errorf("tunnel with a node certificate: %d, want 101", got)
	}
	if got := openTunnel(t, base, p, p.Operator, p.OperatorKey); got != http.StatusForbidden {
		t.Errorf("tunnel with an operator certificate: %d, want 403", got)
	}
	if got := openTunnel(t, base, p, "", ""); got != http.StatusUnauthorized {
		t.Errorf("tunnel without a certificate: %d, want 401", got)
	}
	holder, err := pki.LoadClientCertificate(node, nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	h, err := pki.PublicKeyHash(holder.Current().Leaf.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.recon.DenyNodeKey(t.Context(), "node-1", h[:], "test"); err != nil {
		t.Fatal(err)
	}
	if got := openTunnel(t, base, p, node, nodeKey); got != http.StatusForbidden {
		t.Errorf("tunnel with a denied key: %d, want 403", got)
	}
}

// bulkGuest streams Events of 64 MiB of output.
type bulkGuest struct {
	guestv1connect.UnimplementedProcessServiceHandler
}

const bulkBytes = 64 << 20

func (bulkGuest) Events(ctx context.Context, _ *connect.Request[guestv1.EventsRequest], out *connect.ServerStream[guestv1.EventsResponse]) error {
	chunk := make([]byte, 256<<10)
	for off := 0; off < bulkBytes; off += len(chunk) {
		if err := out.Send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Output{Output: &guestv1.Output{
			Stream: guestv1.Stream_STREAM_STDOUT, Offset: uint64(off), Data: chunk}}}); err != nil {
			return err
		}
	}
	return out.Send(&guestv1.EventsResponse{Event: &guestv1.EventsResponse_Exited{Exited: &guestv1.Exited{EndOffset: bulkBytes}}})
}

// anyRunning is the test double whose every workspace runs its guest.
type anyRunning struct{ *agenttest.Runtime }

func (r anyRunning) GuestTransport(string) (http.RoundTripper, error) {
	r.Start(context.Background(), agent.Spec{WorkspaceID: "w"})
	return r.Runtime.GuestTransport("w")
}

// TestTunnelHeartbeats: a node agent opens a data tunnel by itself; 64 MiB
// of a workspace's output through it do not delay the heartbeats of its
// control stream, which travel on another connection.
func TestTunnelHeartbeats(t *testing.T) {
	srv, base, p := serve(t)
	dir := t.TempDir()
	node, nodeKey := dir+"/node.pem", dir+"/node-key.pem"
	if err := pki.IssueClient(p.CA, p.CAKey, "node-1", pki.RoleNode, time.Hour, node, nodeKey); err != nil {
		t.Fatal(err)
	}
	tlsc, err := pki.ClientConfig(p.CA, node, nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	rt := agenttest.New()
	rt.Guest = bulkGuest{}
	t.Cleanup(rt.Close)
	const beat = 50 * time.Millisecond
	a := agent.New(agent.Config{NodeID: "node-1", Endpoint: base, HTTP: newH2Client(tlsc), Runtime: anyRunning{rt},
		Capacity: &nodev1.Capacity{MemoryMib: 1024, CpuMillis: 1000}, Log: slog.New(slog.DiscardHandler), Heartbeat: beat})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(10 * time.Second)
	for srv.tunnels.Count("node-1") == 0 || !seen(srv, "node-1") {
		if time.Now().After(deadline) {
			t.Fatal("no tunnel and stream from the node within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}

	c := guestv1connect.NewProcessServiceClient(&http.Client{Transport: srv.tunnels}, tunnel.NodeURL("node-1")+agent.DataPath("w"), connect.WithGRPC(),
		connect.WithReadMaxBytes(1<<20))
	stream, err := c.Events(t.Context(), connect.NewRequest(&guestv1.EventsRequest{ProcessId: "p"}))
	if err != nil {
		t.Fatal(err)
	}
	var got int
	var worst time.Duration
	start := time.Now()
	for stream.Receive() {
		got += len(stream.Msg().GetOutput().GetData())
		last, _ := srv.recon.LastSeen("node-1")
		worst = max(worst, time.Since(last))
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	if got != bulkBytes {
		t.Fatalf("received %d bytes, want %d", got, bulkBytes)
	}
	t.Logf("64 MiB in %v; longest silence of the control stream %v (heartbeat every %v)", elapsed, worst, beat)
	if worst > 20*beat {
		t.Errorf("the control stream was silent for %v during the transfer, heartbeats every %v", worst, beat)
	}
}

func seen(s *Server, node string) bool { _, ok := s.recon.LastSeen(node); return ok }

func newH2Client(tlsc *tls.Config) *http.Client {
	return &http.Client{Transport: &http2.Transport{TLSClientConfig: tlsc}}
}

// TestDeniedKeyClosesTunnels: denying a node's key closes the data tunnels
// that node opened with it at once, not only its control stream.
func TestDeniedKeyClosesTunnels(t *testing.T) {
	srv, base, p := serve(t)
	dir := t.TempDir()
	node, nodeKey := dir+"/node.pem", dir+"/node-key.pem"
	if err := pki.IssueClient(p.CA, p.CAKey, "node-1", pki.RoleNode, time.Hour, node, nodeKey); err != nil {
		t.Fatal(err)
	}
	tlsc, err := pki.ClientConfig(p.CA, node, nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	tlsc.NextProtos = []string{"http/1.1"}
	u, _ := url.Parse(base)
	conn, err := tls.Dial("tcp", u.Host, tlsc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nUpgrade: %s\r\nConnection: Upgrade\r\nContent-Length: 0\r\n\r\n", tunnel.Path, u.Host, tunnel.Protocol)
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("tunnel: %v %v", res, err)
	}
	for deadline := time.Now().Add(5 * time.Second); srv.tunnels.Count("node-1") == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the tunnel was not registered")
		}
	}
	holder, err := pki.LoadClientCertificate(node, nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	h, err := pki.PublicKeyHash(holder.Current().Leaf.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.recon.DenyNodeKey(t.Context(), "node-1", h[:], "test"); err != nil {
		t.Fatal(err)
	}
	if n := srv.tunnels.Count("node-1"); n != 0 {
		t.Errorf("%d tunnels of the denied key still open", n)
	}
	// ctrl's end is closed: the node reads the end of its connection
	// (after ctrl's HTTP/2 preface and settings).
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Errorf("the tunnel was not closed by ctrl: %v", err)
	}
}
