package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
)

// Roles: the only organizational unit of a client certificate.
const (
	// RoleOperator is the role of people and tools driving the ctrl API.
	RoleOperator = "operator"
	// RoleNode is the role of node agents.
	RoleNode = "node"
)

// nextProtos are the ALPN protocols offered by both ends.
var nextProtos = []string{"h2", "http/1.1"}

// ServerConfig builds the tls.Config of an HTTPS server presenting the
// certificate chain in certFile with the private key in keyFile, and requiring
// every client to present a certificate that verifies against the CA
// certificates in clientCAFile (tls.RequireAndVerifyClientCert, with the
// ClientAuth extended key usage). A client without a certificate, or with one
// from another CA, fails the handshake.
//
// The minimum version is TLS 1.2 and the ALPN protocols are "h2" and
// "http/1.1". Any valid client certificate is accepted whatever its role; set
// VerifyClientChain and IdentityOf to verify a client and read its role.
func ServerConfig(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	cert, err := loadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	pool, err := loadPool(clientCAFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		NextProtos:   append([]string(nil), nextProtos...),
	}, nil
}

// ClientConfig builds the tls.Config of a client that trusts only the CA
// certificates in caFile to authenticate the server and, when certFile and
// keyFile are both given, presents that certificate and key. Both empty means
// no client certificate; exactly one empty is an error.
//
// The minimum version is TLS 1.2 and the ALPN protocols are "h2" and
// "http/1.1". ServerName is left empty: net/http fills it in from the URL.
func ClientConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    pool,
		NextProtos: append([]string(nil), nextProtos...),
	}
	switch {
	case certFile == "" && keyFile == "":
	case certFile == "" || keyFile == "":
		return nil, errors.New("pki: ClientConfig: a client certificate needs both a certificate file and a key file")
	default:
		cert, err := loadKeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// loadKeyPair loads a PEM certificate chain (leaf first) and its private key.
// Unlike tls.LoadX509KeyPair, its errors name the offending file.
func loadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	if certFile == "" || keyFile == "" {
		return tls.Certificate{}, errors.New("pki: empty certificate or key path")
	}
	certs, err := readCertificates(certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := readPrivateKey(keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	if !publicKeysEqual(certs[0].PublicKey, key.Public()) {
		return tls.Certificate{}, fmt.Errorf("pki: private key %s does not belong to certificate %s", keyFile, certFile)
	}
	out := tls.Certificate{PrivateKey: key, Leaf: certs[0]}
	for _, c := range certs {
		out.Certificate = append(out.Certificate, c.Raw)
	}
	return out, nil
}

// loadPool reads the CA certificates of path into a new pool.
func loadPool(path string) (*x509.CertPool, error) {
	if path == "" {
		return nil, errors.New("pki: empty CA certificate path")
	}
	certs, err := readCertificates(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// Identity is who is on the other end of a verified TLS connection, as told
// by its certificate.
type Identity struct {
	// CommonName is the subject common name, such as "dev-operator".
	CommonName string
	// Role is the subject's organizational unit, such as "operator" or
	// "node", when it has exactly one; empty when it has none or several
	// (several OUs name no role: their order is not even kept when they
	// share a relative distinguished name, which DER sorts).
	Role string
	// OUs are all the subject's organizational units, for messages and
	// logs.
	OUs []string
	// Serial is the certificate serial number in lower-case hexadecimal,
	// for logs and audit records.
	Serial string
}

// IdentityOf returns the identity a certificate names: its common name,
// its role (its only organizational unit) and its serial. It does not
// verify the certificate: call it on a verified leaf (VerifyClientChain, or
// tls.ConnectionState.VerifiedChains).
func IdentityOf(leaf *x509.Certificate) Identity {
	id := Identity{CommonName: leaf.Subject.CommonName, OUs: leaf.Subject.OrganizationalUnit}
	if len(id.OUs) == 1 {
		id.Role = id.OUs[0]
	}
	if leaf.SerialNumber != nil {
		id.Serial = leaf.SerialNumber.Text(16)
	}
	return id
}

// VerifyClientChain verifies the chain a client presented (leaf first, then
// intermediates) against roots, for client authentication. ctrl requests a
// client certificate in the handshake but verifies it here, per request
// path, so that a missing or foreign certificate is answered with an API
// error rather than a broken handshake.
func VerifyClientChain(chain []*x509.Certificate, roots *x509.CertPool) error {
	if len(chain) == 0 {
		return errors.New("pki: no client certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	return err
}

// LoadLeaf reads the first certificate of a PEM file.
func LoadLeaf(certFile string) (*x509.Certificate, error) {
	data, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, fmt.Errorf("pki: %s holds no certificate", certFile)
		}
		if b.Type == "CERTIFICATE" {
			return x509.ParseCertificate(b.Bytes)
		}
	}
}

// ClientCertificate is a client certificate that can be replaced while a
// tls.Config built by ClientConfigWith uses it: new handshakes present the
// latest one. Node agents renew theirs this way without restarting.
type ClientCertificate struct {
	p atomic.Pointer[tls.Certificate]
}

// LoadClientCertificate reads a certificate (chain) and its key.
func LoadClientCertificate(certFile, keyFile string) (*ClientCertificate, error) {
	c := &ClientCertificate{}
	if err := c.Reload(certFile, keyFile); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload reads the files again and makes them the certificate presented
// from now on; on error the previous one stays.
func (c *ClientCertificate) Reload(certFile, keyFile string) error {
	cert, err := loadKeyPair(certFile, keyFile)
	if err != nil {
		return err
	}
	c.p.Store(&cert)
	return nil
}

// Current returns the certificate presented now.
func (c *ClientCertificate) Current() *tls.Certificate { return c.p.Load() }

// ClientConfigWith is ClientConfig with a replaceable client certificate.
func ClientConfigWith(caFile string, c *ClientCertificate) (*tls.Config, error) {
	cfg, err := ClientConfig(caFile, "", "")
	if err != nil {
		return nil, err
	}
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.Current(), nil }
	return cfg, nil
}
