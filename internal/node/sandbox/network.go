package sandbox

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/node/netattach"
)

// Networks of executions. An execution whose configuration is mode
// PUBLIC_INTERNET has a TAP eth0 in its network namespace
// (internal/node/netattach) and a Network on the TAP's endpoint (in
// production internal/node/network's); in any other mode it has lo only,
// no TAP at all. Changes go through ApplyNetwork under the workspace lock:
// NONE → PUBLIC_INTERNET attaches, PUBLIC_INTERNET → NONE closes the Network
// and the TAP (every connection ends at once, eth0 disappears), and
// PUBLIC_INTERNET → PUBLIC_INTERNET is the Network's Apply. The end of an
// execution (stop, kill, its own end, Delete) and Runtime.Close close both.
// A re-adopted execution has no network (the TAP went with the earlier
// node's descriptor) until the agent applies the desired configuration.

// Network is the node's side of one execution's network.
// *network.Network (internal/node/network) implements it.
type Network interface {
	// Apply makes nc (mode PUBLIC_INTERNET) the configuration; on error
	// the previous one stays.
	Apply(nc *nodev1.NetworkConfig) error
	// Status is the applied configuration (DnsConfigVersion is filled in
	// by the runtime).
	Status() *nodev1.NetworkStatus
	// CloseEgress ends every connection through the Egress at once.
	CloseEgress(id string) int
	// Close ends every connection and returns once the Network's
	// goroutines have.
	Close() error
}

// Networking gives executions networks (Config.Network).
type Networking struct {
	// Link is the workspace's side of every TAP: address, gateway, MTU.
	Link netattach.Options
	// New builds an execution's Network on the TAP's endpoint for nc (mode
	// PUBLIC_INTERNET).
	New func(workspaceID string, ep stack.LinkEndpoint, nc *nodev1.NetworkConfig) (Network, error)
}

// execNet is what an execution's network holds; guarded by execution.netMu
// and changed only under the workspace lock too.
type execNet struct {
	link *netattach.Link
	nw   Network
	// revision is the applied policy revision while no Network runs (mode
	// NONE); applied says whether any configuration was applied (not yet
	// after Adopt).
	revision uint64
	applied  bool
}

// isPublic reports whether nc asks for mode PUBLIC_INTERNET.
func isPublic(nc *nodev1.NetworkConfig) bool {
	return nc.GetPolicy().GetMode() == ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET
}

// checkNetwork is validate's part for the network.
func (r *Runtime) checkNetwork(nc *nodev1.NetworkConfig) error {
	if isPublic(nc) && r.cfg.Network == nil {
		return fmt.Errorf("%w: network mode PUBLIC_INTERNET, but this runtime has no networking", ErrInvalidSpec)
	}
	return nil
}

// applyNet makes nc e's network configuration. The caller holds the
// workspace lock. On error the previous configuration stays.
func (r *Runtime) applyNet(e *execution, nc *nodev1.NetworkConfig) error {
	if err := r.checkNetwork(nc); err != nil {
		return err
	}
	e.netMu.Lock()
	defer e.netMu.Unlock()
	if !isPublic(nc) {
		if e.net.nw != nil {
			// Mode NONE admits nothing: applied first, it resets every
			// connection toward the workspace while the link still
			// carries the resets; closing the stack alone would remove
			// the link first and leave the workspace's sockets waiting.
			_ = e.net.nw.Apply(nc)
		}
		e.closeNetLocked()
		e.net.revision, e.net.applied = nc.GetPolicy().GetRevision(), true
		return nil
	}
	if e.net.nw != nil {
		if err := e.net.nw.Apply(nc); err != nil {
			return err
		}
		e.net.applied = true
		return nil
	}
	link, err := r.attach(e)
	if err != nil {
		return err
	}
	nw, err := r.cfg.Network.New(e.ws, link.Endpoint, nc)
	if err != nil {
		link.Close()
		return err
	}
	e.net = execNet{link: link, nw: nw, applied: true}
	return nil
}

// attach makes the TAP in e's network namespace. The namespace is opened
// by pid and used only if PID 1 still runs afterwards (its pidfd says so):
// the pid cannot have named another process in between.
func (r *Runtime) attach(e *execution) (*netattach.Link, error) {
	ns, err := os.Open("/proc/" + strconv.Itoa(e.st.PID) + "/ns/net")
	if err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	defer ns.Close()
	if !e.running() {
		return nil, ErrNotRunning
	}
	return netattach.AttachNetns(ns, r.cfg.Network.Link)
}

// running reports whether PID 1 of e runs now, through its pidfd.
func (e *execution) running() bool {
	if e.pidf == nil || !e.alive() {
		return false
	}
	rc, err := e.pidf.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.PidfdSendSignal(int(fd), 0, nil, 0) }); err != nil {
		return false
	}
	return serr == nil
}

// closeNet closes e's Network and TAP, if any.
func (e *execution) closeNet() {
	e.netMu.Lock()
	defer e.netMu.Unlock()
	e.closeNetLocked()
}

func (e *execution) closeNetLocked() {
	if e.net.nw != nil {
		_ = e.net.nw.Close()
	}
	if e.net.link != nil {
		_ = e.net.link.Close()
	}
	e.net.nw, e.net.link = nil, nil
}

// netStatus is what e's network applies; nil when the runtime has no
// networking.
func (r *Runtime) netStatus(e *execution) *nodev1.NetworkStatus {
	if r.cfg.Network == nil {
		return nil
	}
	e.netMu.Lock()
	defer e.netMu.Unlock()
	st := &nodev1.NetworkStatus{}
	if e.net.nw != nil {
		st = e.net.nw.Status()
	} else if e.net.applied {
		st.AppliedRevision = e.net.revision
	}
	st.DnsConfigVersion = e.st.DNSVersion
	return st
}

// ApplyNetwork makes nc the network configuration of the workspace's
// running execution and returns the status it then applies. On error the
// previous configuration stays, and the status says which. ErrNotRunning
// without an execution.
func (r *Runtime) ApplyNetwork(ctx context.Context, workspaceID string, nc *nodev1.NetworkConfig) (*nodev1.NetworkStatus, error) {
	if r.closed() {
		return nil, ErrClosed
	}
	if err := checkWorkspaceID(workspaceID); err != nil {
		return nil, err
	}
	unlock, err := r.lockWS(ctx, workspaceID)
	if err != nil {
		return nil, err
	}
	defer unlock()
	e := r.get(workspaceID)
	if e == nil || !e.alive() {
		return nil, ErrNotRunning
	}
	err = r.applyNet(e, nc)
	if err != nil {
		r.log.Warn("network configuration not applied", "workspace_id", workspaceID,
			"revision", nc.GetPolicy().GetRevision(), "err", err)
	}
	return r.netStatus(e), err
}

// CloseEgress ends at once every connection of every execution through
// the Egress id (it was deleted).
func (r *Runtime) CloseEgress(id string) {
	r.mu.Lock()
	execs := make([]*execution, 0, len(r.execs))
	for _, e := range r.execs {
		execs = append(execs, e)
	}
	r.mu.Unlock()
	for _, e := range execs {
		e.netMu.Lock()
		if e.net.nw != nil {
			if n := e.net.nw.CloseEgress(id); n > 0 {
				r.log.Info("connections through a deleted Egress ended", "workspace_id", e.ws, "egress_id", id, "count", n)
			}
		}
		e.netMu.Unlock()
	}
}
