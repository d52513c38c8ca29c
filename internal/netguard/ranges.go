// Package netguard decides whether a network endpoint may be dialed by the
// control plane. The SOCKS5 Egress and DNS Resolver endpoints of a sandbox
// must never point at special-purpose addresses (loopback, private-use,
// link-local, documentation, benchmarking, multicast, ...), because that
// would let a tenant reach the control plane's own network.
//
// The package holds one table of special-purpose ranges (the IANA IPv4 and
// IPv6 Special-Purpose Address Registries plus multicast and every IPv6
// address outside global unicast 2000::/3), a strict host:port parser, and a
// Checker that validates literals and resolves names once, checking every
// returned address. Resolve and Dialer return or dial only the checked
// literal addresses, so a second DNS answer cannot rebind the endpoint.
//
// IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) are unmapped and judged as the
// IPv4 address they carry. Other forms that embed an IPv4 address (NAT64
// 64:ff9b::/96 and 64:ff9b:1::/48, 6to4 2002::/16, Teredo 2001::/32 and the
// deprecated IPv4-compatible ::a.b.c.d inside ::/96) are not decoded: the
// ranges themselves are forbidden, whatever IPv4 address they embed.
//
// Names under "localhost" (RFC 6761 §6.3) are loopback and never resolved.
// testdata/ssrf.txt is the SSRF corpus the tests hold the package to: every
// special-purpose range, the embedded IPv6 forms, numeric IPv4 spellings,
// localhost names, DNS rebinding and mixed answers, and public destinations
// that must stay allowed.
//
// Failures are *fault.Error values: malformed input and forbidden endpoints
// are invalid_argument (the latter with Reason ENDPOINT_FORBIDDEN), and a
// resolution that fails for a transient reason is unavailable and retryable.
package netguard

import "net/netip"

// Range is one special-purpose address block.
type Range struct {
	// Prefix is the block, always masked.
	Prefix netip.Prefix
	// Name is the registry's name for the block, used in messages.
	Name string
	// Ref cites the document that reserves the block.
	Ref string
}

// notGlobal names the blocks that together cover all IPv6 space outside
// global unicast 2000::/3.
const notGlobal = "Not IPv6 global unicast (outside 2000::/3)"

// specialPurpose is the table of forbidden ranges. Classify picks the most
// specific match, so nested entries (192.0.0.8/32 inside 192.0.0.0/24,
// ::1/128 inside ::/3) only refine the name reported.
//
// ::ffff:0:0/96 (IPv4-mapped) is deliberately absent: mapped addresses are
// unmapped before lookup and judged by their IPv4 entry.
var specialPurpose = []Range{
	// IANA IPv4 Special-Purpose Address Registry.
	{netip.MustParsePrefix("0.0.0.0/8"), "This network", "RFC 791 §3.2"},
	{netip.MustParsePrefix("0.0.0.0/32"), "This host on this network", "RFC 1122 §3.2.1.3"},
	{netip.MustParsePrefix("10.0.0.0/8"), "Private-Use", "RFC 1918"},
	{netip.MustParsePrefix("100.64.0.0/10"), "Shared Address Space", "RFC 6598"},
	{netip.MustParsePrefix("127.0.0.0/8"), "Loopback", "RFC 1122 §3.2.1.3"},
	{netip.MustParsePrefix("169.254.0.0/16"), "Link Local", "RFC 3927"},
	{netip.MustParsePrefix("172.16.0.0/12"), "Private-Use", "RFC 1918"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF Protocol Assignments", "RFC 6890 §2.1"},
	{netip.MustParsePrefix("192.0.0.0/29"), "IPv4 Service Continuity Prefix", "RFC 7335"},
	{netip.MustParsePrefix("192.0.0.8/32"), "IPv4 dummy address", "RFC 7600"},
	{netip.MustParsePrefix("192.0.0.9/32"), "Port Control Protocol Anycast", "RFC 7723"},
	{netip.MustParsePrefix("192.0.0.10/32"), "Traversal Using Relays around NAT Anycast", "RFC 8155"},
	{netip.MustParsePrefix("192.0.0.170/31"), "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050 §2.2"},
	{netip.MustParsePrefix("192.0.2.0/24"), "Documentation (TEST-NET-1)", "RFC 5737"},
	{netip.MustParsePrefix("192.31.196.0/24"), "AS112-v4", "RFC 7535"},
	{netip.MustParsePrefix("192.52.193.0/24"), "AMT", "RFC 7450"},
	{netip.MustParsePrefix("192.88.99.0/24"), "Deprecated (6to4 Relay Anycast)", "RFC 7526"},
	{netip.MustParsePrefix("192.88.99.2/32"), "6a44-relay anycast address", "RFC 6751"},
	{netip.MustParsePrefix("192.168.0.0/16"), "Private-Use", "RFC 1918"},
	{netip.MustParsePrefix("192.175.48.0/24"), "Direct Delegation AS112 Service", "RFC 7534"},
	{netip.MustParsePrefix("198.18.0.0/15"), "Benchmarking", "RFC 2544"},
	{netip.MustParsePrefix("198.51.100.0/24"), "Documentation (TEST-NET-2)", "RFC 5737"},
	{netip.MustParsePrefix("203.0.113.0/24"), "Documentation (TEST-NET-3)", "RFC 5737"},
	{netip.MustParsePrefix("240.0.0.0/4"), "Reserved", "RFC 1112 §4"},
	{netip.MustParsePrefix("255.255.255.255/32"), "Limited Broadcast", "RFC 8190, RFC 919 §7"},
	// IPv4 multicast (IANA IPv4 Multicast Address Space Registry).
	{netip.MustParsePrefix("224.0.0.0/4"), "Multicast", "RFC 5771"},

	// IPv6 outside global unicast 2000::/3: ::/3, 4000::/2 and 8000::/1.
	{netip.MustParsePrefix("::/3"), notGlobal, "RFC 4291 §2.4"},
	{netip.MustParsePrefix("4000::/2"), notGlobal, "RFC 4291 §2.4"},
	{netip.MustParsePrefix("8000::/1"), notGlobal, "RFC 4291 §2.4"},
	// IANA IPv6 Special-Purpose Address Registry and well-known blocks.
	{netip.MustParsePrefix("::/128"), "Unspecified Address", "RFC 4291"},
	{netip.MustParsePrefix("::1/128"), "Loopback Address", "RFC 4291"},
	{netip.MustParsePrefix("::/96"), "Deprecated IPv4-Compatible Address", "RFC 4291 §2.5.5.1"},
	{netip.MustParsePrefix("64:ff9b::/96"), "IPv4-IPv6 Translation (NAT64)", "RFC 6052"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "Local-Use IPv4/IPv6 Translation", "RFC 8215"},
	{netip.MustParsePrefix("100::/64"), "Discard-Only Address Block", "RFC 6666"},
	{netip.MustParsePrefix("100:0:0:1::/64"), "Dummy IPv6 Prefix", "RFC 9780"},
	{netip.MustParsePrefix("2001::/23"), "IETF Protocol Assignments", "RFC 2928"},
	{netip.MustParsePrefix("2001::/32"), "TEREDO", "RFC 4380, RFC 8190"},
	{netip.MustParsePrefix("2001:1::1/128"), "Port Control Protocol Anycast", "RFC 7723"},
	{netip.MustParsePrefix("2001:1::2/128"), "Traversal Using Relays around NAT Anycast", "RFC 8155"},
	{netip.MustParsePrefix("2001:1::3/128"), "DNS-SD Service Registration Protocol Anycast", "RFC 9665"},
	{netip.MustParsePrefix("2001:2::/48"), "Benchmarking", "RFC 5180"},
	{netip.MustParsePrefix("2001:3::/32"), "AMT", "RFC 7450"},
	{netip.MustParsePrefix("2001:4:112::/48"), "AS112-v6", "RFC 7535"},
	{netip.MustParsePrefix("2001:10::/28"), "Deprecated (previously ORCHID)", "RFC 4843"},
	{netip.MustParsePrefix("2001:20::/28"), "ORCHIDv2", "RFC 7343"},
	{netip.MustParsePrefix("2001:30::/28"), "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "RFC 9374"},
	{netip.MustParsePrefix("2001:db8::/32"), "Documentation", "RFC 3849"},
	{netip.MustParsePrefix("2002::/16"), "6to4", "RFC 3056"},
	{netip.MustParsePrefix("2620:4f:8000::/48"), "Direct Delegation AS112 Service", "RFC 7534"},
	{netip.MustParsePrefix("3fff::/20"), "Documentation", "RFC 9637"},
	{netip.MustParsePrefix("5f00::/16"), "Segment Routing (SRv6) SIDs", "RFC 9602"},
	{netip.MustParsePrefix("fc00::/7"), "Unique-Local", "RFC 4193"},
	{netip.MustParsePrefix("fe80::/10"), "Link-Local Unicast", "RFC 4291"},
	{netip.MustParsePrefix("ff00::/8"), "Multicast", "RFC 4291 §2.7"},
}

// Ranges returns a copy of the special-purpose table, IPv4 entries first.
// Nested entries are listed alongside the blocks that contain them.
func Ranges() []Range {
	out := make([]Range, len(specialPurpose))
	copy(out, specialPurpose)
	return out
}

// Classify reports the special-purpose range addr falls in, if any. addr is
// unmapped first (::ffff:10.0.0.1 is judged as 10.0.0.1) and any IPv6 zone
// is ignored. When ranges nest, the most specific one is reported. Every
// IPv6 address outside 2000::/3 is special-purpose. The zero Addr is not
// classified (ok is false); CheckAddr rejects it as malformed.
func Classify(addr netip.Addr) (Range, bool) {
	a := addr.Unmap().WithZone("")
	if !a.IsValid() {
		return Range{}, false
	}
	best := -1
	for i := range specialPurpose {
		p := specialPurpose[i].Prefix
		if p.Contains(a) && (best < 0 || p.Bits() > specialPurpose[best].Prefix.Bits()) {
			best = i
		}
	}
	if best < 0 {
		return Range{}, false
	}
	return specialPurpose[best], true
}
