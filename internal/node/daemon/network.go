package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"

	"gvisor.dev/gvisor/pkg/tcpip/stack"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/netguard"
	"github.com/kibotos/kibotos/internal/node/netattach"
	"github.com/kibotos/kibotos/internal/node/netstack"
	"github.com/kibotos/kibotos/internal/node/network"
	"github.com/kibotos/kibotos/internal/node/sandbox"
)

// The node's side of workspace networks: the kernel backstop installed at
// start (the node's own nftables table and mark, derived from its state
// directory), and the sandbox's Networking building internal/node/network's
// Network on every attached TAP, with the operator's allow-list and
// resolver in its Checker and every socket marked for the node's backstop.

// checkTUN is Preflight's check of /dev/net/tun.
func checkTUN() error {
	fi, err := os.Stat("/dev/net/tun")
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return errors.New("/dev/net/tun is missing: workspace networks need the tun module (modprobe tun)")
	}
	return nil
}

// ParseResolver parses --resolver: an IP literal and port ("10.0.0.53:53",
// "[fd00::53]:53"); empty is none (the system's resolver).
func ParseResolver(s string) (netip.AddrPort, error) {
	if s == "" {
		return netip.AddrPort{}, nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("--resolver %q: want IP:port of a DNS server", s)
	}
	return ap, nil
}

// resolverAt is a resolver that asks only the DNS server at addr (UDP, and
// TCP for truncated answers), for the names of Egress and Resolver
// endpoints. Its sockets are the node's own: unmarked.
func resolverAt(addr netip.AddrPort) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr.String())
	}}
}

// networking is the sandbox's Networking of a node configured by cfg whose
// backstop judges mark.
func networking(cfg Config, mark uint32) *sandbox.Networking {
	checker := &netguard.Checker{Allow: cfg.AllowEndpointRanges}
	if cfg.Resolver.IsValid() {
		checker.Resolver = resolverAt(cfg.Resolver)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &sandbox.Networking{
		Link: netattach.Options{Address: network.WorkspacePrefix, Gateway: network.Gateway, MTU: netstack.DefaultMTU},
		New: func(ws string, ep stack.LinkEndpoint, nc *nodev1.NetworkConfig) (sandbox.Network, error) {
			n, err := network.New(network.Config{Checker: checker, Mark: mark, Log: log.With("workspace_id", ws)}, ep, nc)
			if err != nil {
				return nil, err
			}
			return n, nil
		},
	}
}

// installBackstop installs the kernel backstop of the node with state
// directory cfg.StateDir, with the operator's allow-list (it replaces what
// an earlier run of this node installed, and leaves other nodes' alone).
func installBackstop(cfg Config) (*netattach.Backstop, error) {
	b, err := netattach.InstallBackstop(cfg.StateDir, cfg.AllowEndpointRanges)
	if err != nil {
		return nil, fmt.Errorf("kernel backstop (nftables, needs nf_tables): %w", err)
	}
	return b, nil
}
