package socks5

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"
)

// testPKI is a CA and a server certificate for DNS name "socks.test" and
// 127.0.0.1, in PEM.
type testPKI struct {
	caPEM, certPEM, keyPEM []byte
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "socks5 test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "socks.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"socks.test"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	return testPKI{
		caPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
}

// tlsProxy is a SOCKS5 proxy inside TLS on 127.0.0.1: TLS terminated here,
// then script.
func tlsProxy(t *testing.T, p testPKI, script func(c net.Conn) error) string {
	t.Helper()
	cert, err := tls.X509KeyPair(p.certPEM, p.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if err := c.(*tls.Conn).Handshake(); err != nil {
					return
				}
				if err := script(c); err != nil {
					t.Error(err)
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func TestTLSClient(t *testing.T) {
	p := newTestPKI(t)
	addr := tlsProxy(t, p, authScript("alice", "pw", 0))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for _, serverName := range []string{"socks.test", "127.0.0.1"} {
		tc, err := TLSClient(ctx, dial(), serverName, p.caPEM)
		if err != nil {
			t.Fatalf("%s: %v", serverName, err)
		}
		if got := tc.ConnectionState().ServerName; serverName == "socks.test" && got != serverName {
			t.Errorf("SNI %q", got)
		}
		if _, err := (&Client{Username: "alice", Password: "pw"}).Connect(ctx, tc, v4); err != nil {
			t.Fatalf("CONNECT inside TLS: %v", err)
		}
	}
	// The system roots do not know the test CA; a wrong name fails; so does a
	// ca_cert without certificates.
	for _, tc := range []struct {
		name string
		ca   []byte
		want string
	}{
		{"socks.test", nil, "certificate"},
		{"other.test", p.caPEM, "other.test"},
		{"socks.test", []byte("not PEM"), "no PEM certificate"},
		{"", p.caPEM, "server name"},
	} {
		_, err := TLSClient(ctx, dial(), tc.name, tc.ca)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("name %q: %v, want an error about %q", tc.name, err, tc.want)
		}
	}
}
