package daemon

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/guest"
	"github.com/kibotos/kibotos/internal/nettest"
	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/node/template"
	"github.com/kibotos/kibotos/internal/nodewire"
)

func TestParseResolver(t *testing.T) {
	for in, ok := range map[string]bool{
		"": true, "10.231.7.2:53": true, "[fd00::53]:5353": true,
		"10.231.7.2": false, "dns.example:53": false, "10.231.7.2:0": false, "[fe80::1%eth0]:53": false,
	} {
		if _, err := ParseResolver(in); (err == nil) != ok {
			t.Errorf("ParseResolver(%q) = %v", in, err)
		}
	}
}

// TestNetworking: the node's wiring of workspace networks, as root, with a
// real workspace: the backstop installed with the allow-list of the test's
// peers; a PUBLIC_INTERNET workspace reaches an HTTP server in a peer
// namespace (allow-listed); the host's own address on that link, although
// inside the allow-list and so admitted by the user-space check, is refused
// by the kernel backstop; a private address outside the allow-list is
// refused; a policy denying the peer's subnet, applied while running,
// refuses it from then on. The status carries the applied revision and DNS
// configuration version; resolv.conf names the node's DNS server.
func TestNetworking(t *testing.T) {
	peer := nettest.NewPeer(t)
	if err := checkTUN(); err != nil {
		t.Skip(err)
	}
	bb, err := template.FindBusybox("")
	if err != nil {
		t.Skipf("needs busybox-static: %v", err)
	}
	dir := t.TempDir()
	guestBin := filepath.Join(dir, "kibotos-guest")
	build := exec.Command("go", "build", "-trimpath", "-o", guestBin, "github.com/kibotos/kibotos/cmd/kibotos-guest")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build kibotos-guest: %v\n%s", err, out)
	}
	tmplDir := filepath.Join(dir, "templates")
	if _, err := template.EnsureDefault(tmplDir, guestBin, bb); err != nil {
		t.Fatal(err)
	}
	srv, err := peer.HTTP(nil)
	if err != nil {
		t.Fatal(err)
	}
	// A server on the host's own address of the peer's link.
	hostLn, err := net.Listen("tcp", netip.AddrPortFrom(peer.HostAddr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	hostSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "the host\n") })}
	go hostSrv.Serve(hostLn)
	t.Cleanup(func() { hostSrv.Close() })

	root := filepath.Join(dir, "node")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := Config{StateDir: root, AllowEndpointRanges: []netip.Prefix{nettest.Range}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	backstop, err := installBackstop(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := backstop.Remove(); err != nil {
			t.Error(err)
		}
	})
	rt, err := sandbox.New(sandbox.Config{Root: root, GuestBinary: guestBin, Network: networking(cfg, backstop.Mark), Log: cfg.Log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt.Close()
		_ = sandbox.Cleanup(root)
	})
	r := NewRuntime(rt, tmplDir)
	ctx := context.Background()
	before := runtime.NumGoroutine()
	const ws = "ws-daemon-net"
	policy := &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET, Revision: 1}
	if err := r.Start(ctx, agent.Spec{WorkspaceID: ws, Generation: 1, TemplateID: "default", CapacityBytes: 64 << 20,
		MemoryMiB: 128, CPUMillis: 1000, Network: &nodev1.NetworkConfig{Policy: policy}}); err != nil {
		t.Fatal(err)
	}
	st := r.Status(ws)
	if !st.Running || st.Network.GetAppliedRevision() != 1 || st.Network.GetDnsConfigVersion() != nodewire.DNSConfigVersion {
		t.Fatalf("status: %+v", st)
	}
	run := func(argv ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		out, serr, code, err := rt.Exec(ctx, ws, argv)
		if err != nil {
			t.Fatal(err)
		}
		return string(out) + string(serr), code
	}
	fetch := func(url string) (string, int, time.Duration) {
		t.Helper()
		t0 := time.Now()
		// (busybox 1.35's wget -T crashes: timeout instead)
		out, code := run("timeout", "10", "wget", "-q", "-O", "-", url)
		return out, code, time.Since(t0)
	}
	if out, _ := run("cat", "/etc/resolv.conf"); out != guest.ResolvConf {
		t.Errorf("resolv.conf: %q", out)
	}
	if out, code, _ := fetch(srv.URL("/")); code != 0 || !strings.HasPrefix(out, "kibotos-nettest peer "+peer.Addr.String()) {
		t.Errorf("the allow-listed peer: exit %d: %q", code, out)
	}
	hostURL := "http://" + hostLn.Addr().String() + "/"
	if out, code, took := fetch(hostURL); code == 0 || took > 5*time.Second {
		t.Errorf("the host's own address (allow-listed, stopped by the backstop): exit %d after %v: %q", code, took, out)
	}
	if out, code, took := fetch("http://10.232.0.1/"); code == 0 || took > 5*time.Second {
		t.Errorf("a private address outside the allow-list: exit %d after %v: %q", code, took, out)
	}
	deny := &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET, Revision: 2,
		Deny: []*ctrlv1.Destination{{Cidr: peer.Prefix.String()}}}
	nst, err := r.ApplyNetwork(ctx, ws, &nodev1.NetworkConfig{Policy: deny})
	if err != nil || nst.GetAppliedRevision() != 2 {
		t.Fatalf("apply: %v, %v", nst, err)
	}
	if out, code, _ := fetch(srv.URL("/")); code == 0 {
		t.Errorf("the denied peer: %q", out)
	}
	if err := r.Delete(ctx, ws); err != nil {
		t.Fatal(err)
	}
	leaks, err := sandbox.Leaks(root)
	if err != nil || len(leaks) > 0 {
		t.Errorf("leaks: %v, %v", leaks, err)
	}
	// The workspace's network (stack, DNS server, drain timer, TAP reader)
	// is gone with it.
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before the start:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
	}
}
