package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/nftables"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/nettest"
	"github.com/kibotos/kibotos/internal/node/netattach"
	"github.com/kibotos/kibotos/internal/node/sandbox"
)

// nftTable is every chain, rule, set and set element of the host's inet
// tables named name, one line each, sorted; nil when there is none.
func nftTable(t *testing.T, name string) []string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tb := range tables {
		if tb.Family != nftables.TableFamilyINet || tb.Name != name {
			continue
		}
		id := fmt.Sprintf("table %d %s", tb.Family, tb.Name)
		out = append(out, id)
		chains, err := c.ListChainsOfTableFamily(tb.Family)
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range chains {
			if ch.Table.Name != tb.Name {
				continue
			}
			out = append(out, id+" chain "+ch.Name)
			rules, err := c.GetRules(tb, ch)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rules {
				s := fmt.Sprintf("%s chain %s rule", id, ch.Name)
				for _, x := range r.Exprs {
					s += fmt.Sprintf(" %T%+v", x, x)
				}
				out = append(out, s+" "+string(r.UserData))
			}
		}
		sets, err := c.GetSets(tb)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range sets {
			out = append(out, id+" set "+st.Name)
			els, err := c.GetSetElements(st)
			if err != nil {
				t.Fatal(err)
			}
			for _, el := range els {
				out = append(out, fmt.Sprintf("%s set %s element %x-%x", id, st.Name, el.Key, el.KeyEnd))
			}
		}
	}
	slices.Sort(out)
	return out
}

// hostTaps is the names of the TAP (and TUN) devices of the host's network
// namespace: a workspace's TAP lives in its own namespace, so none may
// appear here.
func hostTaps(t *testing.T) []string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, i := range ifs {
		if _, err := os.Stat("/sys/class/net/" + i.Name + "/tun_flags"); err == nil {
			out = append(out, i.Name)
		}
	}
	slices.Sort(out)
	return out
}

// added returns the lines of after that are not in before.
func added(before, after []string) []string {
	var out []string
	for _, l := range after {
		if !slices.Contains(before, l) {
			out = append(out, l)
		}
	}
	return out
}

// procWithCmdline finds the host PID of the process whose command line is
// argv.
func procWithCmdline(argv ...string) int {
	want := strings.Join(argv, "\x00") + "\x00"
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && string(b) == want {
			return pid
		}
	}
	return 0
}

// netnsHolders lists what still refers to the network namespace ns
// ("net:[INODE]"): processes in it, descriptors open on it, bind mounts of
// it.
func netnsHolders(ns string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if l, _ := os.Readlink("/proc/" + e.Name() + "/ns/net"); l == ns {
			out = append(out, "process "+e.Name())
		}
		fds, _ := os.ReadDir("/proc/" + e.Name() + "/fd")
		for _, fd := range fds {
			if l, _ := os.Readlink("/proc/" + e.Name() + "/fd/" + fd.Name()); l == ns {
				out = append(out, "descriptor "+fd.Name()+" of process "+e.Name())
			}
		}
	}
	inode := strings.TrimSuffix(strings.TrimPrefix(ns, "net:["), "]")
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for line := range strings.SplitSeq(string(mi), "\n") {
			if strings.Contains(line, " nsfs ") && strings.Contains(line, "net:["+inode+"]") {
				out = append(out, "mount "+line)
			}
		}
	}
	return out
}

// linksIn lists the interfaces of the network namespace of pid.
func linksIn(t *testing.T, pid int) string {
	t.Helper()
	out, err := exec.Command("nsenter", "--net=/proc/"+strconv.Itoa(pid)+"/ns/net", "ip", "-o", "-d", "link").CombinedOutput()
	if err != nil {
		t.Fatalf("nsenter ip link: %v: %s", err, out)
	}
	return string(out)
}

// nodeGoroutines SIGQUITs the node and returns its goroutine dump.
func (e *netEnv) nodeGoroutines(t *testing.T) string {
	t.Helper()
	fi, err := e.node.logf.Stat()
	if err != nil {
		t.Fatal(err)
	}
	before := fi.Size()
	must(t, syscall.Kill(e.node.pid(), syscall.SIGQUIT))
	select {
	case <-e.node.done:
	case <-time.After(15 * time.Second):
		t.Fatal("the node did not exit on SIGQUIT")
	}
	b, err := os.ReadFile(e.node.logf.Name())
	must(t, err)
	return string(b[before:])
}

// TestNetworkLeaks: a workspace with traffic through the network leaves
// nothing behind: after SIGKILL of the node agent its TAP is gone (the
// workspace keeps running, and a restarted node gives it its network
// back); after DeleteWorkspace no network namespace of it, no TAP on the
// host, no nftables rule or set element that was not there before it,
// and no goroutine of the per-workspace stack in the node.
func TestNetworkLeaks(t *testing.T) {
	e := newNetEnv(t)
	nettest.RequireTools(t, "nsenter")
	a, c := nettest.NewPeer(t), nettest.NewPeer(t)
	da, err := a.Dante(nettest.DanteOptions{Auth: true})
	must(t, err)
	h, err := c.HTTP(nil)
	must(t, err)
	hs, err := c.TCP(nettest.Hold, 0)
	must(t, err)
	eg := e.mustEgress(e.socks5(da, true))
	srv, err := a.DNS()
	must(t, err)
	srv.Set("leak.kibotos.test", c.Addr)
	rs := e.mustResolver(&ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: srv.Addr.String()}}})

	// The node is up and has installed its backstop: the table of its own
	// (named after its state directory), which no other node on the host
	// touches. Of the TAP devices, only those that appear later count: root
	// tests of other packages run meanwhile.
	table := netattach.BackstopOf(e.nodeRoot).Table
	nftBefore, tapsBefore := nftTable(t, table), hostTaps(t)
	if len(nftBefore) == 0 {
		t.Fatalf("the node's backstop table inet %s is not installed", table)
	}

	p := publicPolicy(nil, nil, route(eg.GetEgressId(), dest(netip.PrefixFrom(c.Addr, 32).String(), uint32(hs.Addr.Port()))))
	p.Dns = &ctrlv1.DnsConfig{ResolverId: rs.GetResolverId(), ViaEgressId: eg.GetEgressId()}
	w := e.workspace(p)
	traffic := func() {
		t.Helper()
		w.whoami(t, h, c.HostAddr)
		if out, _ := w.probe("dns", "leak.kibotos.test"); !strings.Contains(out, c.Addr.String()) {
			t.Fatalf("dns: %q", out)
		}
		w.holdConn(t, hs) // through the Egress, left open
		w.holdConn(t, hs)
	}
	traffic()
	marker := "987" + strconv.Itoa(os.Getpid()%1000)
	w.start("sleep", marker)
	var pid int
	for deadline := time.Now().Add(10 * time.Second); pid == 0; time.Sleep(50 * time.Millisecond) {
		if pid = procWithCmdline("sleep", marker); pid == 0 && time.Now().After(deadline) {
			t.Fatal("the workspace's sleep process is not found on the host")
		}
	}
	ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
	must(t, err)
	if l := linksIn(t, pid); !strings.Contains(l, "eth0") || !strings.Contains(l, "tun") {
		t.Fatalf("the workspace's links before the kill: %s", l)
	}

	// SIGKILL of the node: the workspace runs on, its TAP goes with the
	// node's descriptor.
	e.node.kill()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		l := linksIn(t, pid)
		if !strings.Contains(l, "eth0") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the TAP outlived the node agent by 10 s: %s", l)
		}
	}
	for _, h := range hs.Conns() {
		select {
		case <-h.Done():
		case <-time.After(10 * time.Second):
			t.Errorf("a connection of the killed node's workspace is still open upstream (from %s)", h.Remote)
		}
	}
	must(t, e.node.start())
	w.waitExec()
	e.waitWS(w.id, 60*time.Second, "AVAILABLE with its policy applied after the node restarted", func(ws *ctrlv1.Workspace) bool {
		st := ws.GetNetworkPolicyStatus()
		return ws.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE && st.GetState() == ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED &&
			st.GetAppliedRevision() == ws.GetNetworkPolicy().GetRevision()
	})
	traffic()

	if _, err := e.ws.DeleteWorkspace(t.Context(), connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Metadata: e.cmdID("delete"), WorkspaceId: w.id, ExpectedExpirationRevision: 1})); err != nil {
		t.Fatalf("DeleteWorkspace: %v", err)
	}
	// Settled: the workspace's processes, namespace and connections gone.
	var holders []string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if holders = netnsHolders(ns); len(holders) == 0 && hs.Open() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15 s after DeleteWorkspace: the workspace's network namespace is held by %v; %d connections open upstream", holders, hs.Open())
		}
	}
	if got := added(tapsBefore, hostTaps(t)); len(got) > 0 {
		t.Errorf("TAP devices on the host after the delete: %v", got)
	}
	// The node's restart replaced its table with the same one; the
	// workspace added nothing to it.
	if after := nftTable(t, table); !slices.Equal(after, nftBefore) {
		t.Errorf("the node's backstop table inet %s changed over the workspace's life; added:\n%s\nremoved:\n%s",
			table, strings.Join(added(nftBefore, after), "\n"), strings.Join(added(after, nftBefore), "\n"))
	}
	leaks, err := sandbox.Leaks(e.nodeRoot)
	must(t, err)
	if len(leaks) > 0 {
		t.Errorf("sandbox leftovers: %v", leaks)
	}
	dump := e.nodeGoroutines(t)
	if !strings.Contains(dump, "goroutine ") || !strings.Contains(dump, "internal/node/agent") {
		t.Fatalf("no goroutine dump of the node:\n%.3000s", dump)
	}
	var stack []string
	for g := range strings.SplitSeq(dump, "\n\n") {
		for _, pkg := range []string{"gvisor.dev/gvisor/pkg/tcpip", "internal/node/netstack", "internal/node/network", "internal/socks5"} {
			if strings.Contains(g, pkg) {
				stack = append(stack, g)
				break
			}
		}
	}
	if len(stack) > 0 {
		t.Errorf("%d goroutines of the network remain in the node after the delete; the first:\n%s", len(stack), stack[0])
	}
}
