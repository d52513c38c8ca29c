//go:build linux

package nettest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// TLSServerName is the DNS name in the certificate of every TLSFront.
const TLSServerName = "socks.kibotos.test"

// TestPKI is a CA and a server certificate it signed, in PEM.
type TestPKI struct {
	CAPEM, CertPEM, KeyPEM []byte
}

// NewTestPKI makes a CA valid for a day and a server certificate for
// serverName and ips.
func NewTestPKI(serverName string, ips ...netip.Addr) (*TestPKI, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kibotos nettest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: serverName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames: []string{serverName},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, a := range ips {
		leaf.IPAddresses = append(leaf.IPAddresses, net.IP(a.AsSlice()))
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &TestPKI{
		CAPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// TLSFront is socat terminating TLS inside a Peer and forwarding each
// connection to a backend (SOCKS5 over TLS when the backend is a Dante).
type TLSFront struct {
	Addr       netip.AddrPort // the Peer's address and the port
	ServerName string         // TLSServerName; the certificate also names the Peer's address
	CAPEM      []byte         // the CA that signed the certificate (an EgressTls ca_cert)

	proc *Proc
}

// TLS starts socat OPENSSL-LISTEN inside the Peer on a free port, with a
// certificate of a new test CA, forwarding to backend.
func (p *Peer) TLS(backend netip.AddrPort) (*TLSFront, error) {
	bin, err := exec.LookPath("socat")
	if err != nil {
		return nil, fmt.Errorf("nettest: socat not found (apt-get install socat): %w", err)
	}
	pki, err := NewTestPKI(TLSServerName, p.Addr)
	if err != nil {
		return nil, err
	}
	dir, err := p.tempDir()
	if err != nil {
		return nil, err
	}
	port, err := p.freePort()
	if err != nil {
		return nil, err
	}
	base := filepath.Join(dir, "socat-"+strconv.Itoa(int(port)))
	cert, key := base+"-cert.pem", base+"-key.pem"
	if err := os.WriteFile(cert, pki.CertPEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(key, pki.KeyPEM, 0o600); err != nil {
		return nil, err
	}
	f := &TLSFront{Addr: netip.AddrPortFrom(p.Addr, port), ServerName: TLSServerName, CAPEM: pki.CAPEM}
	f.proc, err = p.Start(bin,
		fmt.Sprintf("OPENSSL-LISTEN:%d,bind=%s,reuseaddr,fork,cert=%s,key=%s,verify=0", port, p.Addr, cert, key),
		"TCP:"+backend.String())
	if err != nil {
		return nil, err
	}
	if err := waitTCP(f.Addr, f.proc, 10*time.Second); err != nil {
		f.proc.Stop()
		return nil, fmt.Errorf("nettest: socat: %w", err)
	}
	return f, nil
}

// Output returns what socat wrote.
func (f *TLSFront) Output() string { return f.proc.Output() }
