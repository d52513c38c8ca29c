package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// DefaultNodeCertValidity is how long a node certificate issued at
// enrollment or renewal is valid unless the operator chooses otherwise.
// Nodes renew once a third of it is left (checked hourly, same key), so 30
// days leave a running node 10 days to reach ctrl; a certificate and key
// copied off a machine that nobody revoked stop working within a month.
const DefaultNodeCertValidity = 30 * 24 * time.Hour

// Issuer signs node certificates for enrollment with the client CA's key.
// It holds the CA's private key: only ctrl has one.
type Issuer struct {
	ca *authority
}

// LoadIssuer reads the client CA certificate and its private key.
func LoadIssuer(caCertPath, caKeyPath string) (*Issuer, error) {
	ca, err := loadAuthority(caCertPath, caKeyPath, time.Now())
	if err != nil {
		return nil, err
	}
	return &Issuer{ca: ca}, nil
}

// ParseCSR parses a PKCS#10 request and checks its self-signature (proof
// that the requester holds the private key), returning the public key and
// its hash (see PublicKeyHash). The subject is not used.
func ParseCSR(der []byte) (crypto.PublicKey, [32]byte, error) {
	var zero [32]byte
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, zero, errors.New("not a PKCS#10 certificate signing request (DER)")
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, zero, errors.New("the certificate signing request's signature does not verify")
	}
	h, err := PublicKeyHash(csr.PublicKey)
	if err != nil {
		return nil, zero, err
	}
	return csr.PublicKey, h, nil
}

// PublicKeyHash is the SHA-256 of a public key's PKIX (SubjectPublicKeyInfo)
// encoding.
func PublicKeyHash(pub crypto.PublicKey) ([32]byte, error) {
	spki, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return [32]byte{}, fmt.Errorf("pki: unsupported public key: %w", err)
	}
	return sha256.Sum256(spki), nil
}

// IssueNode signs a node client certificate (common name nodeID, OU "node")
// for pub, valid from now for validity (capped at the CA's expiry). It
// returns the certificate as PEM and its NotAfter.
func (i *Issuer) IssueNode(pub crypto.PublicKey, nodeID string, validity time.Duration, now time.Time) ([]byte, time.Time, error) {
	if validity <= 0 {
		validity = DefaultNodeCertValidity
	}
	der, err := i.ca.issue(leafSpec{
		commonName: nodeID,
		ou:         []string{RoleNode},
		usage:      x509.ExtKeyUsageClientAuth,
		validity:   validity,
	}, pub, now)
	if err != nil {
		return nil, time.Time{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("pki: parsing issued certificate: %w", err)
	}
	return encodeCertificate(der), cert.NotAfter, nil
}

// EnsureKey loads the private key at path, or creates one (ECDSA P-256,
// mode 0600, written atomically) when the file does not exist. A node
// creates its key before it presents its enrollment token, so that a resend
// after a crash presents the same key.
func EnsureKey(path string) (crypto.Signer, error) {
	ok, err := fileExists(path)
	if err != nil {
		return nil, err
	}
	if ok {
		return readPrivateKey(path)
	}
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	b, err := encodePrivateKey(key)
	if err != nil {
		return nil, err
	}
	defer clear(b)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if err := writeFileAtomic(path, b, 0o600); err != nil {
		return nil, err
	}
	return key, nil
}

// CreateCSR makes a PKCS#10 request (DER) for key.
func CreateCSR(key crypto.Signer) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, fmt.Errorf("pki: creating certificate signing request: %w", err)
	}
	return der, nil
}

// WriteCertificate checks that certPEM holds a certificate for key and
// writes it to path atomically (mode 0644).
func WriteCertificate(path string, certPEM []byte, key crypto.Signer) error {
	certs, err := parseCertificates(certPEM, "the issued certificate")
	if err != nil {
		return err
	}
	if !publicKeysEqual(certs[0].PublicKey, key.Public()) {
		return errors.New("pki: the issued certificate is not for this node's key")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	return writeFileAtomic(path, certPEM, 0o644)
}
