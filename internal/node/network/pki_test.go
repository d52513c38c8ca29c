package network

import (
	"crypto/tls"
	"net/netip"
	"testing"

	"github.com/kibotos/kibotos/internal/nettest"
)

// testPKI is a CA and a server certificate for "socks.test" and 127.0.0.1, in PEM
// (nettest.NewTestPKI's).
type testPKI struct {
	caPEM, certPEM, keyPEM []byte
}

func newTestPKI(tb testing.TB) testPKI {
	tb.Helper()
	p, err := nettest.NewTestPKI("socks.test", netip.MustParseAddr("127.0.0.1"))
	if err != nil {
		tb.Fatal(err)
	}
	return testPKI{caPEM: p.CAPEM, certPEM: p.CertPEM, keyPEM: p.KeyPEM}
}

func (p testPKI) serverConfig(tb testing.TB) *tls.Config {
	tb.Helper()
	cert, err := tls.X509KeyPair(p.certPEM, p.keyPEM)
	if err != nil {
		tb.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}}
}
