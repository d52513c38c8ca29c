package socks5

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// danteConf is the test configuration of shared/testdata/danted.conf with
// its own port, log file, and one blocked destination (loopback only).
const danteConf = `logoutput: %[1]s
debug: 1
internal: 127.0.0.1 port = %[2]d
external: 127.0.0.1
clientmethod: none
socksmethod: username
user.privileged: root
user.unprivileged: nobody
client pass {
        from: 127.0.0.0/8 to: 0.0.0.0/0
        log: error connect disconnect
}
socks block {
        from: 0.0.0.0/0 to: 127.0.0.1/32 port = %[3]d
        log: error connect
}
socks pass {
        from: 127.0.0.0/8 to: 127.0.0.0/8
        command: connect udpassociate
        socksmethod: username
        log: error connect disconnect iooperation
}
socks pass {
        from: 127.0.0.0/8 to: 127.0.0.0/8
        command: udpreply
        log: error connect disconnect iooperation
}
socks block {
        from: 0.0.0.0/0 to: 0.0.0.0/0
        log: error connect
}
`

// dante is a running danted with a system user for RFC 1929.
type dante struct {
	addr           string
	user, password string
	log            string
	blocked        uint16 // a destination port on 127.0.0.1 the rules block
}

// startDante starts Debian's danted on a free loopback port, with a user made
// for the test (removed at the end). It needs root; it skips without danted
// outside CI (.ci/run installs dante-server).
func startDante(t *testing.T) *dante {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a system user for Dante's username/password check")
	}
	bin, err := exec.LookPath("danted")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("danted not found; .ci/run installs dante-server")
		}
		t.Skip("danted not found: apt-get install dante-server")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	suffix := randHex(t, 4)
	d := &dante{user: "kbs5" + suffix, password: "pw-" + randHex(t, 12), log: filepath.Join(dir, "danted.log")}
	run(t, "", "useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--no-user-group", d.user)
	t.Cleanup(func() { exec.Command("userdel", d.user).Run() })
	run(t, d.user+":"+d.password+"\n", "chpasswd")

	port, blocked := freePort(t), freePort(t)
	conf := filepath.Join(dir, "danted.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, danteConf, d.log, port, blocked), 0o644); err != nil {
		t.Fatal(err)
	}
	d.addr = fmt.Sprintf("127.0.0.1:%d", port)
	d.blocked = uint16(blocked)
	cmd := exec.Command(bin, "-f", conf, "-p", filepath.Join(dir, "danted.pid"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	exited := startGroup(t, cmd)
	t.Cleanup(func() {
		stopGroup(cmd, exited)
		if t.Failed() {
			b, _ := os.ReadFile(d.log)
			t.Logf("danted output:\n%s\ndanted log:\n%s", out.Bytes(), b)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", d.addr, time.Second)
		if err == nil {
			c.Close()
			return d
		}
		select {
		case <-exited:
			t.Fatalf("danted exited: %s", out.Bytes())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("danted not listening on %s: %v", d.addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startGroup starts cmd in a process group of its own (danted and socat fork
// children); the channel is closed when cmd itself has exited.
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

// stopGroup ends the process group startGroup made: SIGTERM, and SIGKILL for
// what remains after 5 s, then waits until none of it is left.
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// tcpEcho is a TCP echo server on 127.0.0.1.
func tcpEcho(t *testing.T) netip.AddrPort {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// udpEcho is a UDP echo server on 127.0.0.1.
func udpEcho(t *testing.T) netip.AddrPort {
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			pc.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

func echoRoundTrip(t *testing.T, c net.Conn) {
	t.Helper()
	msg := bytes.Repeat([]byte("through dante "), 1000)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	go c.Write(msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("echo: %v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("echo: bytes differ")
	}
}

// TestDante runs the client against a real Debian dante-server on loopback:
// CONNECT with RFC 1929, a wrong password, a destination its rules block,
// UDP ASSOCIATE, and SOCKS5 inside TLS (socat terminating TLS in front of it).
func TestDante(t *testing.T) {
	d := startDante(t)
	echo := tcpEcho(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dial := func(t *testing.T, addr string) net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	good := &Client{Username: d.user, Password: d.password}

	t.Run("connect", func(t *testing.T) {
		for _, dst := range []Addr{AddrFromAddrPort(echo), {Name: "127.0.0.1", Port: echo.Port()}} {
			c := dial(t, d.addr)
			bound, err := good.Connect(ctx, c, dst)
			if err != nil {
				t.Fatalf("CONNECT %v: %v", dst, err)
			}
			if !bound.IP.IsLoopback() {
				t.Errorf("bound %v", bound)
			}
			echoRoundTrip(t, c)
		}
	})
	t.Run("wrong password", func(t *testing.T) {
		bad := &Client{Username: d.user, Password: "not-" + d.password}
		_, err := bad.Connect(ctx, dial(t, d.addr), AddrFromAddrPort(echo))
		if !errors.Is(err, ErrAuthFailed) {
			t.Fatalf("%v, want ErrAuthFailed", err)
		}
		if strings.Contains(err.Error(), bad.Password) {
			t.Errorf("error %q shows the password", err)
		}
		_, err = (&Client{}).Connect(ctx, dial(t, d.addr), AddrFromAddrPort(echo))
		if !errors.Is(err, ErrNoAcceptableMethod) {
			t.Fatalf("no credentials: %v, want ErrNoAcceptableMethod", err)
		}
	})
	t.Run("blocked destination", func(t *testing.T) {
		dst := Addr{IP: netip.MustParseAddr("127.0.0.1"), Port: d.blocked}
		_, err := good.Connect(ctx, dial(t, d.addr), dst)
		if !errors.Is(err, ErrNotAllowed) {
			t.Fatalf("%v, want ErrNotAllowed", err)
		}
	})
	t.Run("udp associate", func(t *testing.T) {
		uecho := udpEcho(t)
		pc, err := good.Associate(ctx, dial(t, d.addr), func(ctx context.Context, relay netip.AddrPort) (net.Conn, error) {
			if !relay.Addr().IsLoopback() {
				return nil, fmt.Errorf("relay %v is not on loopback", relay)
			}
			var nd net.Dialer
			return nd.DialContext(ctx, "udp", relay.String())
		})
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		pc.SetDeadline(time.Now().Add(10 * time.Second))
		for i := range 3 {
			msg := fmt.Appendf(nil, "datagram %d through dante", i)
			if _, err := pc.WriteToAddr(msg, AddrFromAddrPort(uecho)); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 1500)
			n, src, err := pc.ReadFromAddr(buf)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf[:n], msg) || src != AddrFromAddrPort(uecho) {
				t.Fatalf("got %q from %v", buf[:n], src)
			}
		}
	})
	t.Run("inside tls", func(t *testing.T) {
		socat, err := exec.LookPath("socat")
		if err != nil {
			if os.Getenv("CI") != "" {
				t.Fatal("socat not found; .ci/run installs it")
			}
			t.Skip("socat not found: apt-get install socat")
		}
		p := newTestPKI(t)
		dir := t.TempDir()
		cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
		os.WriteFile(cert, p.certPEM, 0o600)
		os.WriteFile(key, p.keyPEM, 0o600)
		port := freePort(t)
		cmd := exec.Command(socat,
			fmt.Sprintf("OPENSSL-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork,cert=%s,key=%s,verify=0", port, cert, key),
			"TCP:"+d.addr)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		exited := startGroup(t, cmd)
		t.Cleanup(func() {
			stopGroup(cmd, exited)
			if t.Failed() {
				t.Logf("socat: %s", out.Bytes())
			}
		})
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		var raw net.Conn
		for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
			if raw, err = net.Dial("tcp", addr); err == nil {
				break
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("socat not listening: %v", err)
			}
		}
		t.Cleanup(func() { raw.Close() })
		tc, err := TLSClient(ctx, raw, "socks.test", p.caPEM)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := good.Connect(ctx, tc, AddrFromAddrPort(echo)); err != nil {
			t.Fatalf("CONNECT inside TLS: %v", err)
		}
		echoRoundTrip(t, tc)
		// A CA that did not sign socat's certificate is refused.
		other := newTestPKI(t)
		if _, err := TLSClient(ctx, dial(t, addr), "socks.test", other.caPEM); err == nil {
			t.Error("TLS with a foreign ca_cert succeeded")
		}
	})
}
