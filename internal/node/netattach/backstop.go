//go:build linux

package netattach

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/netguard"
)

// Mark is the SO_MARK of every socket the node opens on behalf of a
// workspace (direct dials, Egress dials, DNS forwarding, UDP relays). The
// backstop judges only packets with exactly this mark; the node's own
// traffic (ctrl, name resolution of Egresses) carries none. The value spells
// "kbot"; it shares no bit pattern with the masks that common
// policy-routing users (Kubernetes, Tailscale, WireGuard tools) match.
const Mark uint32 = 0x6b626f74

// Control sets SO_MARK = Mark on a socket: the Control of a net.Dialer or
// net.ListenConfig whose sockets serve a workspace. It needs CAP_NET_ADMIN.
func Control(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(Mark))
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("netattach: SO_MARK: %w", serr)
	}
	return nil
}

// TableName is the nftables table of the backstop (family inet).
const TableName = "kibotos"

// Backstop is the installed nftables table.
type Backstop struct {
	opts []nftables.ConnOption
}

// InstallBackstop installs, in the node's network namespace, the table inet
// "kibotos" whose output chain (hook output, priority filter, policy
// accept) judges packets marked with Mark, in this order:
//
//  1. a destination of a local address type (fib daddr type local: any
//     address of this host, loopback included) is rejected, whatever allow
//     says;
//  2. a destination inside allow (the operator's --allow-endpoint-ranges)
//     is accepted;
//  3. a destination inside a special-purpose range (netguard.Ranges, IPv4
//     and IPv6) is rejected;
//
// everything else passes. Rejection is a TCP reset for TCP and an ICMP port
// unreachable otherwise, so the node's dial fails at once. The user-space
// checks (netguard) come first; this is what still holds if they have a
// bug. An existing table of that name (an earlier node's) is replaced in the
// same transaction; the table outlives the node process on purpose (a
// restarting node leaves no gap).
func InstallBackstop(allow []netip.Prefix) (*Backstop, error) {
	return installBackstop(allow)
}

func installBackstop(allow []netip.Prefix, opts ...nftables.ConnOption) (*Backstop, error) {
	var allow4, allow6, special4, special6 []netip.Prefix
	for _, p := range allow {
		if !p.IsValid() {
			return nil, fmt.Errorf("netattach: invalid allow prefix %v", p)
		}
		p = p.Masked()
		if p.Addr().Is4() {
			allow4 = append(allow4, p)
		} else {
			allow6 = append(allow6, p)
		}
	}
	for _, r := range netguard.Ranges() {
		if r.Prefix.Addr().Is4() {
			special4 = append(special4, r.Prefix)
		} else {
			special6 = append(special6, r.Prefix)
		}
	}

	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("netattach: nftables: %w", err)
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	// Add (a no-op when it exists), delete, add: one transaction replaces
	// whatever an earlier node left.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)

	sets := map[string]*nftables.Set{}
	for _, s := range []struct {
		name     string
		prefixes []netip.Prefix
		v6       bool
	}{{"allow4", allow4, false}, {"allow6", allow6, true}, {"special4", special4, false}, {"special6", special6, true}} {
		set := &nftables.Set{Table: t, Name: s.name, Interval: true, KeyType: nftables.TypeIPAddr}
		if s.v6 {
			set.KeyType = nftables.TypeIP6Addr
		}
		if err := c.AddSet(set, intervalElements(s.prefixes)); err != nil {
			return nil, fmt.Errorf("netattach: set %s: %w", s.name, err)
		}
		sets[s.name] = set
	}

	accept := nftables.ChainPolicyAccept
	out := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	refuse := c.AddChain(&nftables.Chain{Name: "refuse", Table: t})

	rule := func(ch *nftables.Chain, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs})
	}
	toRefuse := &expr.Verdict{Kind: expr.VerdictGoto, Chain: refuse.Name}
	acceptV := &expr.Verdict{Kind: expr.VerdictAccept}
	// Unmarked packets leave the table at once.
	rule(out,
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(Mark)},
		acceptV)
	rule(out,
		&expr.Fib{Register: 1, ResultADDRTYPE: true, FlagDADDR: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
		toRefuse)
	daddrIn := func(v6 bool, set *nftables.Set, verdict *expr.Verdict) {
		proto, off, n := byte(unix.NFPROTO_IPV4), uint32(16), uint32(4)
		if v6 {
			proto, off, n = unix.NFPROTO_IPV6, 24, 16
		}
		rule(out,
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
			verdict)
	}
	daddrIn(false, sets["allow4"], acceptV)
	daddrIn(true, sets["allow6"], acceptV)
	daddrIn(false, sets["special4"], toRefuse)
	daddrIn(true, sets["special6"], toRefuse)

	rule(refuse,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	rule(refuse, &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH})

	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("netattach: install the nftables table %s: %w", TableName, err)
	}
	return &Backstop{opts: opts}, nil
}

// Remove deletes the table (tests; a node leaves it in place).
func (b *Backstop) Remove() error {
	c, err := nftables.New(b.opts...)
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	c.DelTable(t)
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("netattach: remove the nftables table %s: %w", TableName, err)
	}
	return nil
}

// addrRange is an inclusive range of addresses of one family.
type addrRange struct{ first, last netip.Addr }

// lastAddr is the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	p = p.Masked()
	if p.Addr().Is4() {
		b := p.Addr().As4()
		for i := p.Bits(); i < 32; i++ {
			b[i/8] |= 0x80 >> (i % 8)
		}
		return netip.AddrFrom4(b)
	}
	b := p.Addr().As16()
	for i := p.Bits(); i < 128; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom16(b)
}

// mergeRanges turns prefixes of one family (nested, overlapping or adjacent
// ones included) into sorted disjoint ranges, as an interval set needs.
func mergeRanges(ps []netip.Prefix) []addrRange {
	rs := make([]addrRange, 0, len(ps))
	for _, p := range ps {
		rs = append(rs, addrRange{p.Masked().Addr(), lastAddr(p)})
	}
	slices.SortFunc(rs, func(a, b addrRange) int { return cmp.Or(a.first.Compare(b.first), a.last.Compare(b.last)) })
	var out []addrRange
	for _, r := range rs {
		if n := len(out); n > 0 {
			cur := &out[n-1]
			next := cur.last.Next() // invalid after the family's last address
			if !next.IsValid() || r.first.Compare(next) <= 0 {
				if r.last.Compare(cur.last) > 0 {
					cur.last = r.last
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// intervalElements are the elements of an interval set holding ps: each
// range is its first address and, unless it ends the address space, an
// interval end at the address after it.
func intervalElements(ps []netip.Prefix) []nftables.SetElement {
	var els []nftables.SetElement
	for _, r := range mergeRanges(ps) {
		els = append(els, nftables.SetElement{Key: r.first.AsSlice()})
		if end := r.last.Next(); end.IsValid() {
			els = append(els, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return els
}
