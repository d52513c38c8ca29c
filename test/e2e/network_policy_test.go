package e2e

import (
	"bufio"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/netguard"
	"github.com/kibotos/kibotos/internal/nettest"
)

// whoami checks that a GET of h from the workspace was answered and that
// the server saw client address from; it returns the body.
func (w *netWS) whoami(t *testing.T, h *nettest.HTTPServer, from netip.Addr) {
	t.Helper()
	body := w.get(h.URL("/"))
	_, client, err := nettest.ParseWhoAmI(body)
	if err != nil {
		t.Fatalf("GET %s from the workspace: %q", h.URL("/"), body)
	}
	if client.Addr() != from {
		t.Fatalf("GET %s from the workspace: the server saw the client %s, want %s", h.URL("/"), client, from)
	}
}

// canary listens on host addresses a workspace must never reach and
// records every connection that arrives.
type canary struct {
	mu   sync.Mutex
	hits []string
	port uint16
}

// newCanary listens on every IPv4 address of the host (0.0.0.0) on a free
// port.
func newCanary(t *testing.T) *canary {
	t.Helper()
	c := newCanaryOn(t, netip.AddrPortFrom(netip.IPv4Unspecified(), 0))
	return c
}

// newCanaryOn listens on each of addrs (the port of the first listener
// is c.port).
func newCanaryOn(t *testing.T, addrs ...netip.AddrPort) *canary {
	t.Helper()
	c := &canary{}
	for i, a := range addrs {
		ln, err := net.Listen("tcp4", a.String())
		if err != nil {
			t.Fatalf("canary on %s: %v", a, err)
		}
		t.Cleanup(func() { ln.Close() })
		if i == 0 {
			c.port = uint16(ln.Addr().(*net.TCPAddr).Port)
		}
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				c.mu.Lock()
				c.hits = append(c.hits, conn.RemoteAddr().String()+" -> "+conn.LocalAddr().String())
				c.mu.Unlock()
				conn.Close()
			}
		}()
	}
	return c
}

func (c *canary) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.hits) > 0 {
		t.Errorf("the host canary on port %d was reached: %v", c.port, c.hits)
	}
}

// hostAddrs returns the host's IPv4 addresses (loopback included).
func hostAddrs(t *testing.T) []netip.Addr {
	t.Helper()
	as, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			out = append(out, p.Addr())
		}
	}
	return out
}

// TestNetworkModeNone: a workspace without a policy (mode NONE) has only
// loopback and reaches nothing; PUBLIC_INTERNET gives it eth0 and the
// peers; NONE again takes them away.
func TestNetworkModeNone(t *testing.T) {
	e := newNetEnv(t)
	peer := nettest.NewPeer(t)
	h, err := peer.HTTP(nil)
	must(t, err)
	w := e.workspace(nil)
	ifaces := func() []string {
		var names []string
		sc := bufio.NewScanner(strings.NewReader(w.mustRun(w.tok, "cat", "/proc/net/dev")))
		for sc.Scan() {
			if name, _, ok := strings.Cut(sc.Text(), ":"); ok && !strings.Contains(name, "|") {
				names = append(names, strings.TrimSpace(name))
			}
		}
		slices.Sort(names)
		return names
	}
	if got := ifaces(); !slices.Equal(got, []string{"lo"}) {
		t.Fatalf("mode NONE: interfaces %v, want only lo", got)
	}
	if got := w.dial(h.Addr.String()); got == "ok" {
		t.Fatal("mode NONE reached a peer")
	}
	ws := e.getWS(w.id)
	if st := ws.GetNetworkPolicyStatus(); st.GetState() != ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED || st.GetAppliedRevision() != ws.GetNetworkPolicy().GetRevision() {
		t.Errorf("mode NONE at create: policy %v status %v, want applied", ws.GetNetworkPolicy(), st)
	}

	e.mustSetPolicy(w.id, publicPolicy(nil, nil), nil)
	if got := ifaces(); !slices.Equal(got, []string{"eth0", "lo"}) {
		t.Fatalf("PUBLIC_INTERNET: interfaces %v, want eth0 and lo", got)
	}
	w.whoami(t, h, peer.HostAddr)
	// busybox's wget (the default template) gets there too.
	if out := w.mustRun(w.tok, "wget", "-q", "-O", "-", h.URL("/bb")); !strings.Contains(out, "kibotos-nettest peer "+peer.Addr.String()) {
		t.Errorf("busybox wget: %q", out)
	}

	e.mustSetPolicy(w.id, &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}, ptr(uint32(0)))
	if got := w.dial(h.Addr.String()); got == "ok" {
		t.Fatal("mode NONE again: a peer is still reached")
	}
}

// TestNetworkAllowDeny: allow admits only what it lists, deny wins over
// allow, port ranges count, and an empty allow admits every public
// destination; the policy given at create applies from the first start.
func TestNetworkAllowDeny(t *testing.T) {
	e := newNetEnv(t)
	p, q := nettest.NewPeer(t), nettest.NewPeer(t)
	h1, err := p.HTTP(nil)
	must(t, err)
	s2, err := p.TCP(nettest.Sink, 0)
	must(t, err)
	s3, err := p.TCP(nettest.Sink, 0)
	must(t, err)
	h4, err := q.HTTP(nil)
	must(t, err)
	port := func(a netip.AddrPort) uint32 { return uint32(a.Port()) }
	pNet, pHost := p.Prefix.String(), netip.PrefixFrom(p.Addr, 32).String()

	w := e.workspace(publicPolicy(
		[]*ctrlv1.Destination{dest(pNet, port(h1.Addr)), dest(pNet, port(s3.Addr)), dest(q.Prefix.String())},
		[]*ctrlv1.Destination{dest(pHost, port(s3.Addr))}))
	check := func(step string, want map[netip.AddrPort]string) {
		t.Helper()
		for a, cl := range want {
			if got := w.dial(a.String()); got != cl {
				t.Errorf("%s: dial %s = %s, want %s", step, a, got, cl)
			}
		}
	}
	check("allow and deny at create", map[netip.AddrPort]string{
		h1.Addr: "ok",      // allowed
		s2.Addr: "refused", // not in allow
		s3.Addr: "refused", // allowed and denied: deny wins
		h4.Addr: "ok",      // allowed, all ports
	})
	w.whoami(t, h1, p.HostAddr) // direct: the node dials from the host
	if out, code := w.probe("get", h1.URL("/")); code != 0 || !strings.Contains(out, "client "+p.HostAddr.String()) {
		t.Errorf("get: %q", out)
	}
	r, err := w.run(w.tok, "wget", "-q", "-T", "5", "-O", "-", "http://"+s2.Addr.String()+"/")
	if err != nil || r.exit.GetExitCode() == 0 {
		t.Errorf("busybox wget of a destination outside allow: %v %v %q", r.exit, err, r.stdout)
	}

	ws := e.mustSetPolicy(w.id, publicPolicy(nil, []*ctrlv1.Destination{dest(q.Prefix.String())}), nil)
	rev := ws.GetNetworkPolicy().GetRevision()
	check("empty allow, deny q", map[netip.AddrPort]string{h1.Addr: "ok", s2.Addr: "ok", s3.Addr: "ok", h4.Addr: "refused"})
	// Equal content keeps the revision.
	if again := e.mustSetPolicy(w.id, publicPolicy(nil, []*ctrlv1.Destination{dest(q.Prefix.String())}), nil); again.GetNetworkPolicy().GetRevision() != rev {
		t.Errorf("equal content: revision %d, want %d", again.GetNetworkPolicy().GetRevision(), rev)
	}

	lo, hi := min(port(s2.Addr), port(s3.Addr)), max(port(s2.Addr), port(s3.Addr))
	ws = e.mustSetPolicy(w.id, publicPolicy(nil, []*ctrlv1.Destination{dest(pNet, lo, hi)}), nil)
	if ws.GetNetworkPolicy().GetRevision() != rev+1 {
		t.Errorf("revision %d after a change, want %d", ws.GetNetworkPolicy().GetRevision(), rev+1)
	}
	want := map[netip.AddrPort]string{s2.Addr: "refused", s3.Addr: "refused", h4.Addr: "ok"}
	if a := port(h1.Addr); a < lo || a > hi {
		want[h1.Addr] = "ok"
	}
	check("deny a port range", want)
}

// TestNetworkSpecialRanges: special-purpose destinations are refused at
// the SYN (RST at once), whatever allow says: the corpus's IPv4 literals,
// every address of the host (the host end of a peer's link too, which the
// allow-list admits for the user-space check: the kernel backstop refuses
// it), metadata, the gateway's own ports, and the corpus's names whose
// answers are all special-purpose IPv4 addresses (resolved through the
// workspace's Resolver). Nothing reaches a canary listening on every host
// address.
func TestNetworkSpecialRanges(t *testing.T) {
	e := newNetEnv(t)
	peer := nettest.NewPeer(t)
	h, err := peer.HTTP(nil)
	must(t, err)
	c := newCanary(t)
	cport := strconv.Itoa(int(c.port))

	targets := []string{"169.254.169.254:80", "169.254.77.1:" + cport, "169.254.77.1:22", "10.0.0.1:80", "172.16.0.1:80",
		"192.168.0.1:80", "100.64.0.1:80", "192.0.2.1:80", "198.18.0.1:80", "240.0.0.1:80", "0.0.0.1:80", "224.0.0.1:80", "255.255.255.255:80"}
	for _, a := range hostAddrs(t) {
		targets = append(targets, netip.AddrPortFrom(a, c.port).String())
	}
	for _, entry := range readSSRFCorpus(t) {
		a, ok := entry.literal()
		if ok && entry.verdict == "forbidden" && a.Unmap().Is4() && !nettest.Range.Contains(a.Unmap()) {
			targets = append(targets, netip.AddrPortFrom(a.Unmap(), entry.port).String())
		}
	}
	// The corpus's names whose every answer is a special-purpose IPv4
	// address, resolved in the workspace through its Resolver (never a
	// rebinding name: its public answer would be a real address).
	var names []string
	for _, entry := range readSSRFCorpus(t) {
		host, _, err := netguard.ParseHostPort("f", entry.dest)
		if err != nil || entry.verdict != "forbidden" || len(entry.answers) == 0 {
			continue
		}
		special := true
		for _, step := range entry.answers {
			for _, a := range step {
				special = special && a.Is4() && !nettest.Range.Contains(a) && !localOnly.Contains(a) && !a.IsMulticast() &&
					(&netguard.Checker{}).CheckAddr("f", a) != nil
			}
		}
		if special {
			e.dns.SetSequence(host, entry.answers...)
			names = append(names, entry.dest)
		}
	}
	rs := e.mustResolver(&ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: e.dns.Addr.String()}}})
	targets = append(targets, names...)
	slices.Sort(targets)
	targets = slices.Compact(targets)

	for _, p := range []*ctrlv1.NetworkPolicy{
		publicPolicy(nil, nil),
		// allow names special ranges explicitly: they stay refused.
		publicPolicy([]*ctrlv1.Destination{dest("0.0.0.0/0"), dest("127.0.0.0/8"), dest("10.0.0.0/8"), dest("169.254.0.0/16"),
			dest("100.64.0.0/10"), dest("192.168.0.0/16"), dest("172.16.0.0/12"), dest(peer.Prefix.String())}, nil),
	} {
		p.Dns = &ctrlv1.DnsConfig{ResolverId: rs.GetResolverId()}
		w := e.workspace(p)
		w.whoami(t, h, peer.HostAddr) // the network works
		out, _ := w.probe(append([]string{"dial"}, targets...)...)
		seen := 0
		for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) != 3 {
				t.Fatalf("netprobe dial: %q", line)
			}
			seen++
			ms, _ := strconv.ParseFloat(f[2], 64)
			// The workspace's own kernel may refuse to send to 0.0.0.0/8,
			// broadcast and multicast before the node sees a SYN.
			local := false
			if ap, err := netip.ParseAddrPort(f[0]); err == nil {
				local = localOnly.Contains(ap.Addr()) || ap.Addr().IsMulticast() || ap.Addr() == netip.AddrFrom4([4]byte{255, 255, 255, 255})
			}
			if f[1] == "ok" || f[1] == "timeout" || ms > 1000 || !local && f[1] != "refused" {
				t.Errorf("policy %v: %s was %s after %.1f ms, want refused at once", p.GetAllow(), f[0], f[1], ms)
			}
		}
		if seen != len(targets) {
			t.Fatalf("netprobe dial printed %d results for %d targets:\n%s", seen, len(targets), out)
		}
	}
	c.check(t)
	t.Logf("%d special-purpose destinations (%d of them names of the SSRF corpus) refused from inside the workspace under two policies", len(targets), len(names))
}

// localOnly is 0.0.0.0/8, which a workspace's kernel may not send to.
var localOnly = netip.MustParsePrefix("0.0.0.0/8")

// ssrfEntry is one line of internal/netguard's SSRF corpus.
type ssrfEntry struct {
	line    int
	verdict string
	dest    string
	port    uint16
	answers [][]netip.Addr
}

// literal is the host as an IP address when it is one.
func (s ssrfEntry) literal() (netip.Addr, bool) {
	host, _, err := netguard.ParseHostPort("f", s.dest)
	if err != nil {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(host)
	return a, err == nil
}

// readSSRFCorpus reads internal/netguard/testdata/ssrf.txt (its format is
// described at its top).
func readSSRFCorpus(t *testing.T) []ssrfEntry {
	t.Helper()
	f, err := os.Open("../../internal/netguard/testdata/ssrf.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []ssrfEntry
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		line, _, _ = strings.Cut(line, " -- ")
		fs := strings.Fields(line)
		if len(fs) < 2 {
			t.Fatalf("ssrf.txt:%d: %q", n, line)
		}
		e := ssrfEntry{line: n, verdict: fs[0], dest: fs[1]}
		if _, p, err := netguard.ParseHostPort("f", e.dest); err == nil {
			e.port = p
		}
		for _, extra := range fs[2:] {
			list, ok := strings.CutPrefix(extra, "dns=")
			if !ok {
				t.Fatalf("ssrf.txt:%d: unknown field %q", n, extra)
			}
			for step := range strings.SplitSeq(list, "/") {
				var addrs []netip.Addr
				for s := range strings.SplitSeq(step, ",") {
					a, err := netip.ParseAddr(s)
					if err != nil {
						t.Fatalf("ssrf.txt:%d: answer %q: %v", n, s, err)
					}
					addrs = append(addrs, a)
				}
				e.answers = append(e.answers, addrs)
			}
		}
		out = append(out, e)
	}
	return out
}

// TestNetworkSSRFCorpusAtCreate: every destination form of the SSRF corpus
// as a SOCKS5 Egress endpoint through the real ctrl, its names answered by
// the test DNS server ctrl resolves with: forbidden forms are refused with
// ENDPOINT_FORBIDDEN, malformed ones with INVALID_ARGUMENT, and public
// literals and rebinding names (public at their first answer) are stored.
// The dial half of the corpus (a rebinding Egress refused at dial) is in
// TestNetworkEgressEndpointChecked.
func TestNetworkSSRFCorpusAtCreate(t *testing.T) {
	e := newNetEnv(t)
	corpus := readSSRFCorpus(t)
	counts := map[string]int{}
	for _, c := range corpus {
		host, _, err := netguard.ParseHostPort("f", c.dest)
		if err == nil && len(c.answers) > 0 {
			e.dns.SetSequence(host, c.answers...)
		}
		inRange := false
		if a, ok := c.literal(); ok && nettest.Range.Contains(a.Unmap()) {
			inRange = true
		}
		for _, step := range c.answers {
			for _, a := range step {
				inRange = inRange || nettest.Range.Contains(a.Unmap())
			}
		}
		if inRange {
			continue // the test's allow-list admits it
		}
		_, err = e.createEgress(&ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: c.dest}}})
		code, reason := connect.CodeOf(err), detailOf(err).GetReason()
		ok := false
		switch c.verdict {
		case "forbidden":
			ok = code == connect.CodeInvalidArgument && reason == ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN
		case "malformed":
			ok = code == connect.CodeInvalidArgument && reason == ctrlv1.FailureReason_FAILURE_REASON_INVALID_ARGUMENT
		case "rebind", "allow":
			ok = err == nil
		default:
			t.Fatalf("ssrf.txt:%d: verdict %q", c.line, c.verdict)
		}
		if !ok {
			t.Errorf("ssrf.txt:%d: CreateEgress(%q) = %v (reason %v), want %s", c.line, c.dest, err, reason, c.verdict)
		}
		counts[c.verdict]++
	}
	t.Logf("corpus through CreateEgress: %v", counts)
	if counts["forbidden"]+counts["malformed"]+counts["rebind"] < 80 {
		t.Errorf("only %v refused-form entries checked; the corpus must hold at least 80", counts)
	}
	if _, err := e.createEgress(&ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "127.0.0.1:1080"}}}); connect.CodeOf(err) != connect.CodeInvalidArgument ||
		detailOf(err).GetReason() != ctrlv1.FailureReason_FAILURE_REASON_ENDPOINT_FORBIDDEN {
		t.Errorf("CreateEgress on 127.0.0.1: %v, want invalid_argument ENDPOINT_FORBIDDEN", err)
	}
}

// TestNetworkNodeUnreachable: with the node stopped (SIGSTOP) a policy
// update answers a retryable TIMED_OUT or NODE_UNREACHABLE within ctrl's
// wait, the policy status is UNKNOWN and, once the node's grace has passed,
// the workspace too; when the node runs again the same command succeeds
// and the policy is applied. With the node killed the answer is the same,
// and a restarted node applies it.
func TestNetworkNodeUnreachable(t *testing.T) {
	e := newNetEnv(t)
	peer := nettest.NewPeer(t)
	h, err := peer.HTTP(nil)
	must(t, err)
	w := e.workspace(publicPolicy(nil, nil))
	w.whoami(t, h, peer.HostAddr)
	deny := publicPolicy(nil, []*ctrlv1.Destination{dest(peer.Prefix.String())})

	unreachable := func(step string, req *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) {
		t.Helper()
		t0 := time.Now()
		_, err := e.ws.UpdateWorkspaceNetworkPolicy(t.Context(), connect.NewRequest(req))
		took := time.Since(t0)
		d := detailOf(err)
		code := connect.CodeOf(err)
		if err == nil || !d.GetRetryable() ||
			!(code == connect.CodeDeadlineExceeded && d.GetReason() == ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT ||
				code == connect.CodeUnavailable && (d.GetReason() == ctrlv1.FailureReason_FAILURE_REASON_NODE_UNREACHABLE || d.GetReason() == ctrlv1.FailureReason_FAILURE_REASON_TIMED_OUT)) {
			t.Fatalf("%s: UpdateWorkspaceNetworkPolicy = %v (detail %v), want a retryable TIMED_OUT or NODE_UNREACHABLE", step, err, d)
		}
		if took > netCommandWait+5*time.Second {
			t.Errorf("%s: the answer took %s, more than ctrl's wait %s", step, took, netCommandWait)
		}
		ws := e.getWS(w.id)
		if ws.GetNetworkPolicyStatus().GetState() != ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_UNKNOWN {
			t.Errorf("%s: policy status %v, want UNKNOWN", step, ws.GetNetworkPolicyStatus())
		}
		e.waitWS(w.id, netNodeGrace+10*time.Second, "state UNKNOWN", func(ws *ctrlv1.Workspace) bool {
			return ws.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN
		})
	}
	applied := func(step string, req *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) {
		t.Helper()
		var res *connect.Response[ctrlv1.UpdateWorkspaceNetworkPolicyResponse]
		deadline := time.Now().Add(60 * time.Second)
		for {
			var err error
			res, err = e.ws.UpdateWorkspaceNetworkPolicy(t.Context(), connect.NewRequest(req))
			if err == nil {
				break
			}
			if !detailOf(err).GetRetryable() || time.Now().After(deadline) {
				t.Fatalf("%s: the same command after the node came back: %v", step, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		ws := res.Msg.GetWorkspace()
		if st := ws.GetNetworkPolicyStatus(); st.GetState() != ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED || st.GetAppliedRevision() != ws.GetNetworkPolicy().GetRevision() {
			t.Fatalf("%s: status %v for policy revision %d", step, st, ws.GetNetworkPolicy().GetRevision())
		}
		e.waitWS(w.id, 30*time.Second, "AVAILABLE", func(ws *ctrlv1.Workspace) bool {
			return ws.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
		})
	}

	// SIGSTOP: the stream stays open, the node says nothing.
	req := &ctrlv1.UpdateWorkspaceNetworkPolicyRequest{Metadata: e.cmdID("stopped"), WorkspaceId: w.id, NetworkPolicy: deny}
	must(t, syscall.Kill(e.node.pid(), syscall.SIGSTOP))
	unreachable("node stopped", req)
	must(t, syscall.Kill(e.node.pid(), syscall.SIGCONT))
	applied("node continued", req)
	if got := w.dial(h.Addr.String()); got != "refused" {
		t.Errorf("after the node applied the deny: %s", got)
	}

	// SIGKILL: the stream is gone; a restarted node adopts the workspace and
	// applies what is expected.
	e.node.kill()
	req = &ctrlv1.UpdateWorkspaceNetworkPolicyRequest{Metadata: e.cmdID("killed"), WorkspaceId: w.id, NetworkPolicy: publicPolicy(nil, nil)}
	unreachable("node killed", req)
	must(t, e.node.start())
	applied("node restarted", req)
	w.whoami(t, h, peer.HostAddr)
}
