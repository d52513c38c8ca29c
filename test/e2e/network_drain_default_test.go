package e2e

import (
	"context"
	"net/netip"
	"strconv"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/nettest"
)

// TestNetworkDrainDefault: UpdateEgress and UpdateWorkspaceNetworkPolicy
// without drain_seconds leave a connection whose path they move running
// on its old path (open and passing bytes both ways 5 s later: the default
// is 600 s), where drain_seconds 0 closes such a connection at once, and
// a later update with drain_seconds 0 does not shorten the default drain
// already running. The node does not log drain deadlines, so only this
// behaviour is checked, not the 600 itself.
func TestNetworkDrainDefault(t *testing.T) {
	const held = 5 * time.Second
	e := newNetEnv(t)
	a, b, c := nettest.NewPeer(t), nettest.NewPeer(t), nettest.NewPeer(t)
	da, err := a.Dante(nettest.DanteOptions{})
	must(t, err)
	db, err := b.Dante(nettest.DanteOptions{})
	must(t, err)
	ex, err := c.TCP(nettest.Echo, 0)
	must(t, err)
	ey, err := c.TCP(nettest.Echo, 0)
	must(t, err)
	eg := e.mustEgress(e.socks5(da, false))
	cHost := netip.PrefixFrom(c.Addr, 32).String()
	px, py := uint32(ex.Addr.Port()), uint32(ey.Addr.Port())
	// x goes through the Egress, y directly.
	xOnly := publicPolicy(nil, nil, route(eg.GetEgressId(), dest(cHost, px)))
	w := e.workspace(xOnly)

	from := func(what string, conn *nettest.Conn, want netip.Addr) {
		t.Helper()
		if conn.Remote.Addr() != want {
			t.Fatalf("%s came from %s, want from %s", what, conn.Remote, want)
		}
	}
	updateEgress := func(spec *ctrlv1.EgressSpec, drain *uint32) time.Time {
		t.Helper()
		eg = e.updateEgress(eg, spec, drain)
		t0 := time.Now()
		rev := eg.GetRevision()
		e.waitWS(w.id, 15*time.Second, "egress revision applied", func(ws *ctrlv1.Workspace) bool { return egressApplied(ws, eg.GetEgressId(), rev) })
		return t0
	}

	bx, x := w.echoConn(t, ex)
	from("x", x, a.Addr)
	by, y := w.echoConn(t, ey)
	from("y", y, c.HostAddr)

	// UpdateEgress without drain_seconds: x, on revision 1, drains.
	t0 := updateEgress(e.socks5(db, false), nil)
	// A policy update without drain_seconds moving y from direct to the
	// Egress: y drains (x's path is unchanged by it).
	both := publicPolicy(nil, nil, route(eg.GetEgressId(), dest(cHost, px), dest(cHost, py)))
	e.mustSetPolicy(w.id, both, nil)
	t1 := time.Now()
	_, x2 := w.echoConn(t, ex)
	from("a new connection to x", x2, b.Addr)
	_, y2 := w.echoConn(t, ey)
	from("a new connection to y", y2, b.Addr)
	openFor(t, "x after UpdateEgress without drain_seconds", x, t0, held)
	openFor(t, "y after a policy update without drain_seconds", y, t1, held)
	flowing(t, "x draining after UpdateEgress without drain_seconds", x, bx)
	flowing(t, "y draining after a policy update without drain_seconds", y, by)

	// drain_seconds 0 closes what it moves at once: x2 and y2, on revision 2.
	t2 := updateEgress(e.socks5(da, false), ptr(uint32(0)))
	t.Logf("UpdateEgress with drain 0: closed %s and %s after the call returned",
		closedBy(t, "x2 after UpdateEgress with drain 0", x2, t2, 3*time.Second),
		closedBy(t, "y2 after UpdateEgress with drain 0", y2, t2, 3*time.Second))
	_, y3 := w.echoConn(t, ey)
	from("y3", y3, a.Addr)
	t3 := time.Now()
	e.mustSetPolicy(w.id, xOnly, ptr(uint32(0))) // y back to direct
	t.Logf("policy update with drain 0: closed %s after the call was sent", closedBy(t, "y3 after a policy update with drain 0", y3, t3, 3*time.Second))

	// x and y keep the default drain started earlier.
	flowing(t, "x after later updates with drain 0", x, bx)
	flowing(t, "y after later updates with drain 0", y, by)
}

// echoConn starts, in the workspace, a busybox nc to the Echo server s
// fed a line every 200 ms, and returns it (its stdout is what came back)
// with the server's side of its connection.
func (w *netWS) echoConn(t *testing.T, s *nettest.TCPServer) (*bgProc, *nettest.Conn) {
	t.Helper()
	bg := w.start("sh", "-c", `while :; do echo tick; sleep 0.2; done | nc "$0" "$1"`, s.Addr.Addr().String(), strconv.Itoa(int(s.Addr.Port())))
	bg.waitFor(t, "tick", 15*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("the echo connection did not arrive: %v (nc said %q)", err, bg.output())
	}
	return bg, c
}

// flowing checks that c, an echoConn, is open and still carries bytes
// both ways: the server reads more and the workspace reads more back.
func flowing(t *testing.T, what string, c *nettest.Conn, bg *bgProc) {
	t.Helper()
	in, back := c.In.Load(), len(bg.output())
	deadline := time.Now().Add(3 * time.Second)
	for c.In.Load() < in+10 || len(bg.output()) < back+10 {
		select {
		case <-c.Done():
			at, err := c.Ended()
			t.Fatalf("%s: the connection ended at %s (%v)", what, at.Format(time.RFC3339Nano), err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: open but no bytes for 3 s (server read %d more, the workspace %d more)", what, c.In.Load()-in, len(bg.output())-back)
		}
	}
}
