// Package nettest starts the network peers of the network tests and
// benchmarks, as root, on this machine only: a Peer is a network namespace
// joined to the host by a veth pair on a private /24 of Range
// (10.231.N.0/24: the host side is .1, the peer .2), and in it run the
// servers a workspace's traffic is sent to: an HTTP server, TCP echo, sink
// and source servers that record their connections, a DNS server
// (miekg/dns) with configurable and rebinding answers, Debian's danted as a
// SOCKS5 Egress (CONNECT and UDP ASSOCIATE, with or without RFC 1929 auth
// against a system user made for it) and socat terminating TLS in front of
// it with a test CA.
//
// Peers reach each other through the host (forwarding is enabled on the
// host ends of their veth pairs only, and each peer routes only Range
// there), so a SOCKS5 peer can carry traffic to a server in another peer.
// Nothing leaves the machine: no peer has a route outside Range.
//
// Each Peer takes a free N under a lock file (tests in parallel and in
// other processes do not clash), removes what a crashed run left on that N,
// and removes everything it made (processes, the namespace, links, system
// users) on Close. NewPeer is the form for tests: it skips when not root
// (fails under CI=true) and closes the Peer at the end of the test.
//
// The command netprobe (nettest/netprobe) is the client that tests and
// benchmarks run inside a workspace.
package nettest
