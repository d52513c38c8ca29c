//go:build linux

package nettest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DanteOptions configures a Dante server.
type DanteOptions struct {
	// Auth requires RFC 1929 username/password: a system user is created
	// for the server (and removed with the Peer). Without it the server
	// accepts the "no authentication" method only.
	Auth bool
	// Block lists destinations the server refuses (a SOCKS5 "not allowed"
	// reply); every other destination inside Range is allowed.
	Block []netip.AddrPort
	// Debug is danted's debug level (0: none; 1 logs every step).
	Debug int
}

// Dante is Debian's danted running inside a Peer: SOCKS5 CONNECT and UDP
// ASSOCIATE to destinations inside Range, from clients inside Range.
type Dante struct {
	Addr           netip.AddrPort // the Peer's address and the port
	User, Password string         // set with DanteOptions.Auth
	LogPath        string         // danted's log file

	proc *Proc
}

// danteConf is a danted 1.4 configuration: %[1]s log file, %[2]s the
// address, %[3]d the port, %[4]s the socks method, %[5]s the socks rules'
// method line, %[6]s block rules, %[7]d the debug level, %[8]s Range.
const danteConf = `logoutput: %[1]s
debug: %[7]d
internal: %[2]s port = %[3]d
external: %[2]s
clientmethod: none
socksmethod: %[4]s
user.privileged: root
user.unprivileged: nobody
client pass {
        from: %[8]s to: 0.0.0.0/0
        log: error connect disconnect
}
%[6]ssocks pass {
        from: %[8]s to: %[8]s
        command: connect udpassociate
%[5]s        log: error connect disconnect
}
socks pass {
        from: %[8]s to: %[8]s
        command: udpreply
        log: error connect disconnect
}
socks block {
        from: 0.0.0.0/0 to: 0.0.0.0/0
        log: error connect
}
`

// Dante starts danted inside the Peer on a free port and waits until it
// accepts connections.
func (p *Peer) Dante(o DanteOptions) (*Dante, error) {
	bin, err := exec.LookPath("danted")
	if err != nil {
		return nil, fmt.Errorf("nettest: danted not found (apt-get install dante-server): %w", err)
	}
	dir, err := p.tempDir()
	if err != nil {
		return nil, err
	}
	port, err := p.freePort()
	if err != nil {
		return nil, err
	}
	d := &Dante{Addr: netip.AddrPortFrom(p.Addr, port)}
	method, ruleMethod := "none", ""
	if o.Auth {
		if d.User, d.Password, err = p.addUser(); err != nil {
			return nil, err
		}
		method, ruleMethod = "username", "        socksmethod: username\n"
	}
	var block strings.Builder
	for _, b := range o.Block {
		fmt.Fprintf(&block, "socks block {\n        from: 0.0.0.0/0 to: %s/32 port = %d\n        log: error connect\n}\n", b.Addr(), b.Port())
	}
	name := "danted-" + strconv.Itoa(int(port))
	d.LogPath = filepath.Join(dir, name+".log")
	conf := filepath.Join(dir, name+".conf")
	text := fmt.Sprintf(danteConf, d.LogPath, p.Addr, port, method, ruleMethod, block.String(), o.Debug, Range)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		return nil, err
	}
	if d.proc, err = p.Start(bin, "-f", conf, "-p", filepath.Join(dir, name+".pid")); err != nil {
		return nil, err
	}
	if err := waitTCP(d.Addr, d.proc, 10*time.Second); err != nil {
		d.proc.Stop()
		return nil, fmt.Errorf("nettest: danted: %w\nlog:\n%s", err, d.Log())
	}
	return d, nil
}

// Log returns danted's log so far.
func (d *Dante) Log() string {
	b, _ := os.ReadFile(d.LogPath)
	return string(b)
}

// DanteConnect is a CONNECT danted passed, from its log.
type DanteConnect struct {
	Client netip.AddrPort // who asked (the node, for a workspace's connection)
	User   string         // the RFC 1929 user, if any
	Dest   netip.AddrPort // the destination it connected to
}

// Connects returns the CONNECTs danted logged as passed so far, in order.
// danted logs one a moment after it answered the client: poll (WaitConnect)
// rather than read once.
func (d *Dante) Connects() []DanteConnect {
	var out []DanteConnect
	for line := range strings.SplitSeq(d.Log(), "\n") {
		// ... info: pass(2): tcp/connect [: CLIENT.PORT INTERNAL.PORT -> EXTERNAL.PORT DEST.PORT
		_, rest, ok := strings.Cut(line, ": tcp/connect [: ")
		if !ok || !strings.Contains(line, "pass(") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 5 || f[2] != "->" {
			continue
		}
		client, err1 := danteAddr(f[0])
		dest, err2 := danteAddr(f[4])
		if err1 == nil && err2 == nil {
			user := ""
			if u, _, ok := strings.Cut(f[0], "@"); ok {
				user = strings.TrimPrefix(u, "username%")
			}
			out = append(out, DanteConnect{Client: client, Dest: dest, User: user})
		}
	}
	return out
}

// WaitConnect waits until danted has logged a passed CONNECT to dest, and
// returns it.
func (d *Dante) WaitConnect(ctx context.Context, dest netip.AddrPort) (DanteConnect, error) {
	for {
		for _, c := range d.Connects() {
			if c.Dest == dest {
				return c, nil
			}
		}
		select {
		case <-ctx.Done():
			return DanteConnect{}, fmt.Errorf("nettest: danted at %s logged no CONNECT to %s: %w", d.Addr, dest, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// danteAddr parses danted's ADDR.PORT notation (a client authenticated
// with RFC 1929 is written username%USER@ADDR.PORT).
func danteAddr(s string) (netip.AddrPort, error) {
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		s = s[i+1:]
	}
	i := strings.LastIndexByte(s, '.')
	if i < 0 {
		return netip.AddrPort{}, fmt.Errorf("no port in %q", s)
	}
	a, err := netip.ParseAddr(s[:i])
	if err != nil {
		return netip.AddrPort{}, err
	}
	port, err := strconv.ParseUint(s[i+1:], 10, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return netip.AddrPortFrom(a, uint16(port)), nil
}

// Output returns what danted wrote to stdout and stderr.
func (d *Dante) Output() string { return d.proc.Output() }

// Stop stops danted (an Egress that went away); the Peer would at Close.
func (d *Dante) Stop() { d.proc.Stop() }

// PID is danted's main process (for its memory, for example).
func (d *Dante) PID() int { return d.proc.Cmd.Process.Pid }

// addUser creates a system user for RFC 1929 (no home, no login shell) with
// a random password; it is removed at Close, and by the next Peer on this
// subnet number after a crash.
func (p *Peer) addUser() (user, password string, err error) {
	p.mu.Lock()
	p.users++
	user = userPrefix(p.N) + strconv.Itoa(p.users)
	p.mu.Unlock()
	password = "pw-" + randHex(12)
	if out, err := exec.Command("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--no-user-group", user).CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("nettest: useradd %s: %v: %s", user, err, out)
	}
	p.onClose(func() error {
		if out, err := exec.Command("userdel", user).CombinedOutput(); err != nil {
			return fmt.Errorf("nettest: userdel %s: %v: %s", user, err, out)
		}
		return nil
	})
	cmd := exec.Command("chpasswd")
	cmd.Stdin = strings.NewReader(user + ":" + password + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("nettest: chpasswd: %v: %s", err, out)
	}
	return user, password, nil
}

// tempDir is the Peer's directory for configurations, keys and logs,
// created on first use (mode 0755: danted's unprivileged children read
// under it) and removed at Close.
func (p *Peer) tempDir() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dir != "" {
		return p.dir, nil
	}
	dir, err := os.MkdirTemp("", p.Name+"-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err
	}
	p.dir = dir
	// Registered first, so removed after the processes using it stopped.
	p.closers = append([]func() error{func() error { return os.RemoveAll(dir) }}, p.closers...)
	return dir, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
