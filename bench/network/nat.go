//go:build linux

package main

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// natTable is the nftables table of the kernel reference's NAT.
const natTable = "kibotos-netbench"

// masquerade makes the host masquerade what comes from the prefix from and
// leaves through the interface out (the kernel reference: a "fake
// workspace" namespace whose connections reach the server from the host's
// address on the server's link, as the node's do). It returns the undo.
func masquerade(from netip.Prefix, out string) (func() error, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: natTable})
	ch := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	m := [4]byte{}
	for i := range from.Bits() {
		m[i/8] |= 0x80 >> (i % 8)
	}
	name := make([]byte, 16)
	copy(name, out)
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: m[:], Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: from.Masked().Addr().AsSlice()},
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name},
		&expr.Masq{},
	}})
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables masquerade: %w", err)
	}
	return func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		c.DelTable(t)
		return c.Flush()
	}, nil
}
