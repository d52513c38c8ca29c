// Package pki issues and loads the X.509 material that protects the Kibotos
// control plane ("ctrl").
//
// The ctrl API is served over HTTPS and requires mutual TLS: every client must
// present a certificate issued by the ctrl certificate authority, whose only
// organizational unit (OU) names the caller's role ("operator", "node"). A
// certificate with another OU, several or none has no role and calls
// nothing. ctrl verifies the certificate per connection, in its handler, so
// that a missing or foreign one is answered with an API error rather than a
// broken handshake.
//
// The package offers:
//
//   - EnsureDev, which creates (once) and afterwards reuses a development PKI
//     under the ctrl data directory: a CA, an operator client certificate and
//     a server certificate;
//   - IssueClient, which issues further client certificates (for example for
//     nodes or additional operators) from an existing CA;
//   - ServerConfig and ClientConfig, which build the tls.Config values for the
//     two ends of a connection;
//   - VerifyClientChain and IdentityOf, which verify a client's certificate
//     chain and tell who is on the other end (common name, role, serial).
//
// All keys are ECDSA P-256, stored as PEM "PRIVATE KEY" blocks (PKCS#8) in
// files of mode 0600; certificates are stored as PEM "CERTIFICATE" blocks.
// Files are written atomically (temporary file, fsync, rename), so a reader
// never observes a half-written file.
//
// Errors returned by this package name files and describe what is wrong, but
// never contain key material: the contents of a key file are never quoted,
// and parse errors of key files are replaced by a fixed description.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Validity periods used by the package.
const (
	// DevCAValidity is how long a development CA certificate is valid.
	DevCAValidity = 10 * 365 * 24 * time.Hour

	// DevLeafValidity is how long the development server certificate
	// created by EnsureDev is valid. It is deliberately long (five years
	// rather than the usual one) so that a development installation does not
	// break on a certificate expiry; it authenticates ctrl, not a caller.
	DevLeafValidity = 5 * 365 * 24 * time.Hour

	// DevOperatorValidity is how long the development operator certificate
	// is valid: a year at most, since it is a credential that is copied
	// around (KIBO_CERT). EnsureDev issues a new one at a start that finds
	// it expired, or valid for longer than this (issued by an earlier
	// release, with DevLeafValidity).
	DevOperatorValidity = 365 * 24 * time.Hour

	// clockSkew is how far NotBefore is moved into the past so that a
	// freshly issued certificate is accepted by peers whose clock is
	// slightly behind.
	clockSkew = 5 * time.Minute
)

// PEM block types written by the package.
const (
	pemCertificate = "CERTIFICATE"
	pemPrivateKey  = "PRIVATE KEY"
)

// authority is a loaded and checked certificate authority.
type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
	pool *x509.CertPool
}

// newAuthority checks that cert is a usable CA certificate at now whose public
// key is the public half of key, and wraps the pair.
func newAuthority(cert *x509.Certificate, key crypto.Signer, certPath string, now time.Time) (*authority, error) {
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return nil, fmt.Errorf("pki: %s is not a CA certificate", certPath)
	}
	if cert.KeyUsage != 0 && cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("pki: CA certificate %s does not allow certificate signing", certPath)
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("pki: the private key does not belong to CA certificate %s", certPath)
	}
	if err := checkValidAt(cert, certPath, now); err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &authority{cert: cert, key: key, pool: pool}, nil
}

// loadAuthority reads a CA certificate and its private key.
func loadAuthority(certPath, keyPath string, now time.Time) (*authority, error) {
	certs, err := readCertificates(certPath)
	if err != nil {
		return nil, err
	}
	key, err := readPrivateKey(keyPath)
	if err != nil {
		return nil, err
	}
	return newAuthority(certs[0], key, certPath, now)
}

// verify reports whether cert chains to the authority at now and may be used
// for usage.
func (a *authority) verify(cert *x509.Certificate, usage x509.ExtKeyUsage, now time.Time) error {
	_, err := cert.Verify(x509.VerifyOptions{
		Roots:       a.pool,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{usage},
	})
	return err
}

// leafSpec describes an end-entity certificate to issue.
type leafSpec struct {
	commonName string
	ou         []string
	usage      x509.ExtKeyUsage
	dnsNames   []string
	ips        []net.IP
	validity   time.Duration
}

// issue signs a certificate for pub according to spec. NotAfter is capped at
// the authority's own NotAfter: a certificate cannot usefully outlive its
// issuer.
func (a *authority) issue(spec leafSpec, pub crypto.PublicKey, now time.Time) (der []byte, err error) {
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(spec.validity)
	if notAfter.After(a.cert.NotAfter) {
		notAfter = a.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			CommonName:         spec.commonName,
			OrganizationalUnit: spec.ou,
		},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{spec.usage},
		BasicConstraintsValid: true,
		DNSNames:              spec.dnsNames,
		IPAddresses:           spec.ips,
	}
	der, err = x509.CreateCertificate(rand.Reader, tmpl, a.cert, pub, a.key)
	if err != nil {
		return nil, fmt.Errorf("pki: signing certificate for %q: %w", spec.commonName, err)
	}
	return der, nil
}

// selfSignCA creates a CA certificate for key. The subject is derived from the
// public key, so re-creating the certificate for the same key yields the same
// subject and subject key identifier, and certificates issued earlier keep
// verifying.
func selfSignCA(key crypto.Signer, now time.Time) ([]byte, *x509.Certificate, error) {
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	skid, err := keyID(key.Public())
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization: []string{"Kibotos development"},
			CommonName:   fmt.Sprintf("Kibotos development CA %x", skid[:4]),
		},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(DevCAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		SubjectKeyId:          skid,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: self-signing CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: parsing new CA certificate: %w", err)
	}
	return der, cert, nil
}

// keyID returns a 160-bit subject key identifier for pub (RFC 7093 method 1:
// the leftmost 160 bits of the SHA-256 hash of the subjectPublicKey).
func keyID(pub crypto.PublicKey) ([]byte, error) {
	spki, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("pki: encoding public key: %w", err)
	}
	sum := sha256.Sum256(spki)
	return sum[:20], nil
}

// newSerial returns a random, positive, 128-bit serial number.
func newSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, fmt.Errorf("pki: generating serial number: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

// newKey generates an ECDSA P-256 private key.
func newKey() (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generating ECDSA P-256 key: %w", err)
	}
	return key, nil
}

// encodeCertificate returns der as a PEM "CERTIFICATE" block.
func encodeCertificate(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: der})
}

// encodePrivateKey returns key as a PEM "PRIVATE KEY" (PKCS#8) block.
func encodePrivateKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		// The error names the key type only, never key material.
		return nil, errors.New("pki: encoding private key as PKCS#8 failed")
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), nil
}

// readCertificates reads every PEM "CERTIFICATE" block of path. It fails if
// there is none or one does not parse.
func readCertificates(path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pki: reading certificate: %w", err)
	}
	return parseCertificates(data, path)
}

func parseCertificates(data []byte, path string) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != pemCertificate {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("pki: %s: invalid certificate: %w", path, err)
		}
		certs = append(certs, cert)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("pki: %s contains no PEM %q block", path, pemCertificate)
	}
	return certs, nil
}

// readPrivateKey reads the first private key PEM block of path: PKCS#8
// ("PRIVATE KEY") or, for compatibility, SEC 1 ("EC PRIVATE KEY"). Errors
// never include the file's contents or the underlying parser's message.
func readPrivateKey(path string) (crypto.Signer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pki: reading private key: %w", err)
	}
	defer clear(data) // best effort: do not leave key bytes lying around
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("pki: %s contains no PEM %q block", path, pemPrivateKey)
		}
		switch block.Type {
		case pemPrivateKey:
			key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			clear(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("pki: %s: malformed PKCS#8 private key", path)
			}
			signer, ok := key.(crypto.Signer)
			if !ok {
				return nil, fmt.Errorf("pki: %s: unsupported private key type %T", path, key)
			}
			return signer, nil
		case "EC PRIVATE KEY":
			key, err := x509.ParseECPrivateKey(block.Bytes)
			clear(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("pki: %s: malformed EC private key", path)
			}
			return key, nil
		}
	}
}

// publicKeysEqual reports whether a and b are the same public key.
func publicKeysEqual(a, b crypto.PublicKey) bool {
	ka, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ka.Equal(b)
}

// checkValidAt fails if cert is not valid at now.
func checkValidAt(cert *x509.Certificate, path string, now time.Time) error {
	if now.Before(cert.NotBefore) {
		return fmt.Errorf("pki: certificate %s is not valid before %s", path, cert.NotBefore.UTC().Format(time.RFC3339))
	}
	if now.After(cert.NotAfter) {
		return fmt.Errorf("pki: certificate %s expired at %s", path, cert.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// IssueClient issues a client certificate signed by the CA whose certificate
// and private key are at caCertPath and caKeyPath.
//
// The certificate has a fresh ECDSA P-256 key, the subject common name
// commonName and the single organizational unit role (for example "operator"
// or "node"; IdentityOf reports it as the Identity's Role), the extended key
// usage ClientAuth, a random 128-bit serial number, and is valid from now
// (minus a few minutes of clock-skew allowance) for validity, but never
// beyond the CA certificate's own expiry.
//
// The key is written to keyPath (mode 0600) before the certificate is written
// to certPath (mode 0644); each file is replaced atomically, and an existing
// file is overwritten. Missing parent directories are created with mode 0700.
func IssueClient(caCertPath, caKeyPath, commonName, role string, validity time.Duration, certPath, keyPath string) error {
	switch {
	case commonName == "":
		return errors.New("pki: IssueClient: empty common name")
	case role == "":
		return errors.New("pki: IssueClient: empty role")
	case validity <= 0:
		return fmt.Errorf("pki: IssueClient: validity %s is not positive", validity)
	case certPath == "" || keyPath == "":
		return errors.New("pki: IssueClient: empty certificate or key path")
	case filepath.Clean(certPath) == filepath.Clean(keyPath):
		return errors.New("pki: IssueClient: certificate and key paths are the same file")
	}
	now := time.Now()
	ca, err := loadAuthority(caCertPath, caKeyPath, now)
	if err != nil {
		return err
	}
	return issuePair(ca, leafSpec{
		commonName: commonName,
		ou:         []string{role},
		usage:      x509.ExtKeyUsageClientAuth,
		validity:   validity,
	}, certPath, keyPath, now)
}

// issuePair generates a key, issues a certificate for it and writes both,
// key first: if the process dies in between, the certificate on disk (if any)
// no longer matches the key, which EnsureDev detects and repairs.
func issuePair(ca *authority, spec leafSpec, certPath, keyPath string, now time.Time) error {
	key, err := newKey()
	if err != nil {
		return err
	}
	der, err := ca.issue(spec, key.Public(), now)
	if err != nil {
		return err
	}
	keyPEM, err := encodePrivateKey(key)
	if err != nil {
		return err
	}
	defer clear(keyPEM)
	for _, dir := range []string{filepath.Dir(keyPath), filepath.Dir(certPath)} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("pki: %w", err)
		}
	}
	if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	return writeFileAtomic(certPath, encodeCertificate(der), 0o644)
}
