package network

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"text/template"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
)

// needRoot skips a test that needs root outside CI (which runs as root).
func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI runs as root; this test needs it: %s", why)
		}
		t.Skip("needs root: " + why)
	}
}

func lookBin(t *testing.T, name, pkg string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not found; .ci/run installs %s", name, pkg)
		}
		t.Skipf("%s not found: apt-get install %s", name, pkg)
	}
	return bin
}

// dante is a running Debian danted on loopback.
type dante struct {
	addr           string
	user, password string // empty: no authentication
}

// startDante runs danted with testdata/danted.conf; with auth, RFC 1929 against a
// system user made for the test (removed at its end).
func startDante(t *testing.T, auth bool) *dante {
	t.Helper()
	needRoot(t, "runs danted and creates a system user for its username/password check")
	bin := lookBin(t, "danted", "dante-server")
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	d := &dante{}
	method := "none"
	if auth {
		method = "username"
		d.user, d.password = "kbnw"+randHex(t, 4), "pw-"+randHex(t, 12)
		run(t, "", "useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--no-user-group", d.user)
		t.Cleanup(func() { exec.Command("userdel", d.user).Run() })
		run(t, d.user+":"+d.password+"\n", "chpasswd")
	}
	tmpl, err := template.ParseFiles("testdata/danted.conf")
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	log := filepath.Join(dir, "danted.log")
	var conf bytes.Buffer
	if err := tmpl.Execute(&conf, map[string]any{"Log": log, "Port": port, "Method": method}); err != nil {
		t.Fatal(err)
	}
	confPath := filepath.Join(dir, "danted.conf")
	if err := os.WriteFile(confPath, conf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	d.addr = fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(bin, "-f", confPath, "-p", filepath.Join(dir, "danted.pid"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	exited := startGroup(t, cmd)
	t.Cleanup(func() {
		stopGroup(cmd, exited)
		if t.Failed() {
			b, _ := os.ReadFile(log)
			t.Logf("danted output:\n%s\ndanted log:\n%s", out.Bytes(), b)
		}
	})
	waitListening(t, d.addr, exited, &out)
	return d
}

func waitListening(t *testing.T, addr string, exited chan struct{}, out *bytes.Buffer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			t.Fatalf("exited before listening on %s: %s", addr, out.Bytes())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listening on %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startGroup starts cmd in a process group of its own (danted and socat fork);
// the channel is closed when cmd has exited.
func startGroup(t *testing.T, cmd *exec.Cmd) chan struct{} {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	return exited
}

// stopGroup ends startGroup's process group: SIGTERM, SIGKILL after 5 s.
func stopGroup(cmd *exec.Cmd, exited chan struct{}) {
	pgid := cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGTERM)
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(-pgid, 0) == nil {
		if time.Now().After(deadline) {
			syscall.Kill(-pgid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
	<-exited
}

func randHex(t *testing.T, n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func run(t *testing.T, stdin string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", name, err, out)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// socatTLS terminates TLS with pki's certificate on a free loopback port in front
// of addr.
func socatTLS(t *testing.T, pki testPKI, addr string) string {
	t.Helper()
	bin := lookBin(t, "socat", "socat")
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(cert, pki.certPEM, 0o600)
	os.WriteFile(key, pki.keyPEM, 0o600)
	port := freePort(t)
	cmd := exec.Command(bin,
		fmt.Sprintf("OPENSSL-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork,cert=%s,key=%s,verify=0", port, cert, key),
		"TCP:"+addr)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	exited := startGroup(t, cmd)
	t.Cleanup(func() {
		stopGroup(cmd, exited)
		if t.Failed() {
			t.Logf("socat: %s", out.Bytes())
		}
	})
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	waitListening(t, listen, exited, &out)
	return listen
}

// TestDante: connections and DNS through a real Debian dante-server: CONNECT with
// and without RFC 1929, a wrong password, SOCKS5 inside TLS (socat), DNS to a UDP
// Resolver through UDP ASSOCIATE (pooled, re-established) and to a TCP Resolver
// through CONNECT.
func TestDante(t *testing.T) {
	authed, noAuth := startDante(t, true), startDante(t, false)
	echo := echoServer(t)
	dst := standIn(t, echo)
	p := public(1)
	p.Egresses = []*ctrlv1.EgressRoute{route("eg-d", dest("198.51.100.0/24"))}
	egressOf := func(d *dante, rev uint64) *nodev1.NetworkEgress {
		e := socksEgress("eg-d", rev, d.addr, 0)
		if d.user != "" {
			withAuth(e, d.user, d.password)
		}
		return e
	}
	apply := func(t *testing.T, w *ws, e *nodev1.NetworkEgress) {
		t.Helper()
		if err := w.n.Apply(&nodev1.NetworkConfig{Policy: p, Egresses: []*nodev1.NetworkEgress{e}}); err != nil {
			t.Fatal(err)
		}
	}
	udpAddr := dnsServe(t, "udp", answerA("198.51.100.7"))
	tcpAddr := dnsServe(t, "tcp", answerA("198.51.100.8"))
	pki := newTestPKI(t)
	front := socatTLS(t, pki, authed.addr)
	before := runtime.NumGoroutine()
	log := &dialLog{}
	w := newWS(t, testConfig(log), &nodev1.NetworkConfig{Policy: p, Egresses: []*nodev1.NetworkEgress{egressOf(authed, 1)}})

	t.Run("connect with RFC 1929", func(t *testing.T) {
		c := w.mustDial(t, dst)
		big := bytes.Repeat([]byte("through dante "), 1<<16)
		go c.Write(big)
		got := make([]byte, len(big))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, big) {
			t.Fatalf("echo of %d bytes through Dante: %v", len(big), err)
		}
	})
	t.Run("wrong password", func(t *testing.T) {
		e := egressOf(authed, 2)
		e.Spec.GetSocks5().Password = "not-" + authed.password
		apply(t, w, e)
		w.mustRefuse(t, dst)
	})
	t.Run("connect without authentication", func(t *testing.T) {
		apply(t, w, egressOf(noAuth, 3))
		w.mustDial(t, dst)
	})
	t.Run("inside TLS", func(t *testing.T) {
		e := tlsEgress(socksEgress("eg-d", 4, front, 0), "socks.test", string(pki.caPEM))
		withAuth(e, authed.user, authed.password)
		apply(t, w, e)
		c := w.mustDial(t, dst)
		roundTrip(t, c)
	})

	t.Run("DNS to a UDP resolver through UDP ASSOCIATE", func(t *testing.T) {
		e := egressOf(authed, 5)
		e.Spec.UdpEnabled = true
		if err := w.n.Apply(withDNS(2, udpResolver("rs-u", udpAddr), "eg-d", e)); err != nil {
			t.Fatal(err)
		}
		wantA(t, w.query(t, "udp", "one.example.test.", dns.TypeA), "198.51.100.7")
		first := w.association("eg-d")
		wantA(t, w.query(t, "tcp", "two.example.test.", dns.TypeA), "198.51.100.7")
		if w.association("eg-d") != first {
			t.Fatal("a second query did not reuse the association")
		}
		// The association dies: the next query establishes another.
		first.pc.Close()
		wantA(t, w.query(t, "udp", "three.example.test.", dns.TypeA), "198.51.100.7")
		if a := w.association("eg-d"); a == first || a == nil {
			t.Fatal("no new association after the first ended")
		}
		if slices.Contains(log.seen(), "udp "+udpAddr) {
			t.Fatalf("the resolver was reached directly: %q", log.seen())
		}
		if !slices.ContainsFunc(log.seen(), func(s string) bool { return strings.HasPrefix(s, "udp 127.0.0.1:") }) {
			t.Fatalf("no UDP socket to Dante's relay: %q", log.seen())
		}
	})
	t.Run("DNS to a TCP resolver through CONNECT", func(t *testing.T) {
		if err := w.n.Apply(withDNS(3, tcpResolver("rs-t", tcpAddr), "eg-d", egressOf(noAuth, 6))); err != nil {
			t.Fatal(err)
		}
		if w.association("eg-d") != nil {
			t.Fatal("the UDP association outlived its configuration")
		}
		for _, network := range []string{"udp", "tcp"} {
			wantA(t, w.query(t, network, "four.example.test.", dns.TypeA), "198.51.100.8")
		}
	})
	t.Run("DeleteEgress", func(t *testing.T) {
		apply(t, w, egressOf(noAuth, 7))
		c := w.mustDial(t, dst)
		if n := w.n.CloseEgress("eg-d"); n != 1 {
			t.Fatalf("CloseEgress ended %d, want 1", n)
		}
		ended(t, c, time.Second)
	})
	// With an association up again, Close leaves nothing running.
	if err := w.n.Apply(withDNS(4, udpResolver("rs-u", udpAddr), "eg-d", func() *nodev1.NetworkEgress {
		e := egressOf(noAuth, 8)
		e.Spec.UdpEnabled = true
		return e
	}())); err != nil {
		t.Fatal(err)
	}
	wantA(t, w.query(t, "udp", "five.example.test.", dns.TypeA), "198.51.100.7")
	w.close()
	settled(t, before)
}

// association is the live UDP association through the Egress id, nil if none.
func (w *ws) association(id string) *association {
	d := w.n.dns
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.assocs[id]
}

// TestMark: every socket the node opens carries Config.Mark.
func TestMark(t *testing.T) {
	needRoot(t, "SO_MARK needs CAP_NET_ADMIN")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	const mark = 0x6b6e7477
	n := &Network{cfg: Config{Mark: mark}}
	for _, network := range []string{"tcp", "udp"} {
		c, err := n.socket(context.Background(), network, l.Addr().(*net.TCPAddr).AddrPort())
		if err != nil {
			t.Fatal(err)
		}
		rc, err := c.(syscall.Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var got int
		var gerr error
		rc.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK) })
		c.Close()
		if gerr != nil || got != mark {
			t.Fatalf("%s socket: SO_MARK %#x (%v), want %#x", network, got, gerr, mark)
		}
	}
}
