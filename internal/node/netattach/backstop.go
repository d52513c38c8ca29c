//go:build linux

package netattach

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/netguard"
)

// A node's backstop is an nftables table of its own, judging packets with a
// mark of its own, both derived from the node's state directory: several
// nodes on one host (tests running in parallel, a dev ctrl next to a real
// node) each install theirs without touching the others'. Two tables
// judging the same mark would conflict (an accept in one table's base chain
// does not stop another's reject), so each table judges only its node's
// mark, and an install never takes a mark another node's table already
// judges: it keeps the mark its own table judges (a restart), else takes
// the one derived from the directory, else the next free one after it.

// TablePrefix begins the name of every node's backstop table.
const TablePrefix = "kibotos-"

// markBase is the fixed part of every node's mark: its high half spells
// "kb". The low half is 14 bits of the state directory's hash; bits 14 and
// 15 stay clear, being those Kubernetes marks packets with for masquerade
// (0x4000) and drop (0x8000).
const (
	markBase uint32 = 0x6b620000
	markTag  uint32 = 0x3fff
)

// Backstop is a node's kernel backstop: the nftables table (family inet)
// that rejects what a workspace must not reach, and the mark of the sockets
// it judges.
type Backstop struct {
	// Table is the table's name: TablePrefix and 12 hex digits of the
	// SHA-256 of the state directory, the same as the sandbox's root tag
	// (the node's cgroup directory) for that directory.
	Table string
	// Mark is the SO_MARK of every socket the node opens on behalf of a
	// workspace (direct dials, Egress dials, DNS forwarding, UDP relays); the
	// table judges only packets with exactly this mark. The node's own
	// traffic (ctrl, name resolution of Egresses) carries none.
	Mark uint32
	opts []nftables.ConnOption
}

// BackstopOf is the backstop of the node whose state directory is stateDir,
// installed or not. It depends only on the directory (made absolute, and
// with symlinks resolved when it exists), so that a restarting node finds
// and replaces its own table.
func BackstopOf(stateDir string) *Backstop {
	dir, err := filepath.Abs(stateDir)
	if err != nil {
		dir = stateDir
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	h := sha256.Sum256([]byte(filepath.Clean(dir)))
	return &Backstop{
		Table: TablePrefix + hex.EncodeToString(h[:6]),
		Mark:  markBase | uint32(binary.BigEndian.Uint16(h[:2]))&markTag,
	}
}

// Control sets SO_MARK = b.Mark on a socket: the Control of a net.Dialer or
// net.ListenConfig whose sockets serve a workspace. It needs CAP_NET_ADMIN.
func (b *Backstop) Control(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(b.Mark))
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("netattach: SO_MARK: %w", serr)
	}
	return nil
}

// InstallBackstop installs, in the node's network namespace, the backstop
// of the node whose state directory is stateDir (BackstopOf): the table
// inet b.Table whose output chain (hook output, priority filter, policy
// accept) judges packets marked with b.Mark, in this order:
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
// bug. The node's existing table (an earlier run's) is replaced in the same
// transaction; the table outlives the node process on purpose (a
// restarting node leaves no gap). Other nodes' tables are left alone; if
// one of them judges the mark derived from the directory (a hash
// collision, 1 in 16,384 for two nodes; likelier with tables that nodes
// gone long ago left behind), the install takes the next mark no table
// judges, and a restart keeps it (chooseMark). b.Mark is the mark chosen.
func InstallBackstop(stateDir string, allow []netip.Prefix) (*Backstop, error) {
	b := BackstopOf(stateDir)
	if err := b.install(allow); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *Backstop) install(allow []netip.Prefix) error {
	var allow4, allow6, special4, special6 []netip.Prefix
	for _, p := range allow {
		if !p.IsValid() {
			return fmt.Errorf("netattach: invalid allow prefix %v", p)
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

	c, err := nftables.New(b.opts...)
	if err != nil {
		return fmt.Errorf("netattach: nftables: %w", err)
	}
	others, own, err := marksInUse(c, b.Table)
	if err != nil {
		return err
	}
	if b.Mark, err = chooseMark(b.Mark, own, others); err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: b.Table}
	// Add (a no-op when it exists), delete, add: one transaction replaces
	// whatever this node's earlier run left.
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
			return fmt.Errorf("netattach: set %s: %w", s.name, err)
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
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(b.Mark)},
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
		return fmt.Errorf("netattach: install the nftables table inet %s: %w", b.Table, err)
	}
	return nil
}

// marksInUse reads the marks the backstop tables (TablePrefix) judge: those
// of other nodes' tables, by mark, and the one table own judges (0 when it
// has none).
func marksInUse(c *nftables.Conn, own string) (map[uint32]string, uint32, error) {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, 0, fmt.Errorf("netattach: list nftables tables: %w", err)
	}
	others, mine := map[uint32]string{}, uint32(0)
	for _, t := range tables {
		if !strings.HasPrefix(t.Name, TablePrefix) {
			continue
		}
		rules, err := c.GetRules(t, &nftables.Chain{Name: "output", Table: t})
		if err != nil {
			if errors.Is(err, unix.ENOENT) { // removed meanwhile, or not a backstop
				continue
			}
			return nil, 0, fmt.Errorf("netattach: read nftables table inet %s: %w", t.Name, err)
		}
		m, ok := judgedMark(rules)
		switch {
		case !ok:
		case t.Name == own:
			mine = m
		default:
			others[m] = t.Name
		}
	}
	return others, mine, nil
}

// chooseMark picks the mark of a node's backstop: the one its own table
// judges already (own, when not 0 and no other table judges it), else
// derived, else the first mark after derived (within markBase|markTag,
// wrapping) that no other table judges.
func chooseMark(derived, own uint32, others map[uint32]string) (uint32, error) {
	if own != 0 && own&^markTag == markBase {
		if _, taken := others[own]; !taken {
			return own, nil
		}
	}
	for i := uint32(0); i <= markTag; i++ {
		m := markBase | (derived+i)&markTag
		if _, taken := others[m]; !taken {
			return m, nil
		}
	}
	return 0, fmt.Errorf("netattach: every backstop mark (%#x to %#x) is judged by another table on this host: remove the tables of nodes that are gone (nft delete table inet %s…)",
		markBase, markBase|markTag, TablePrefix)
}

// judgedMark is the mark a backstop's output chain judges: the operand of
// its first rule, meta mark != M accept.
func judgedMark(rules []*nftables.Rule) (uint32, bool) {
	if len(rules) == 0 || len(rules[0].Exprs) < 2 {
		return 0, false
	}
	m, ok1 := rules[0].Exprs[0].(*expr.Meta)
	cmp, ok2 := rules[0].Exprs[1].(*expr.Cmp)
	if !ok1 || !ok2 || m.Key != expr.MetaKeyMARK || cmp.Op != expr.CmpOpNeq || len(cmp.Data) != 4 {
		return 0, false
	}
	return binaryutil.NativeEndian.Uint32(cmp.Data), true
}

// Remove deletes the node's table: for tests, and for an operator retiring
// a node (a node leaves its table in place). A table already gone is no
// error.
func (b *Backstop) Remove() error {
	c, err := nftables.New(b.opts...)
	if err != nil {
		return err
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: b.Table})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("netattach: remove the nftables table inet %s: %w", b.Table, err)
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
