package pki

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// DevOperatorCommonName is the common name of the operator certificate
// created by EnsureDev.
const DevOperatorCommonName = "dev-operator"

// devServerCommonName is the common name of the development server
// certificate. Clients match the server by its subject alternative names, not
// by this name.
const devServerCommonName = "kibotos-ctrl"

// defaultHosts are always included in the development server certificate.
var defaultHosts = []string{"localhost", "127.0.0.1", "::1"}

// DevPaths are the files of a development PKI. The file names are a contract:
// other components and tests rely on them.
type DevPaths struct {
	// Dir is the directory holding the files: <data-dir>/pki.
	Dir string
	// CA is the CA certificate, ca.pem.
	CA string
	// CAKey is the CA private key, ca-key.pem.
	CAKey string
	// Operator is the operator client certificate, operator.pem.
	Operator string
	// OperatorKey is the operator private key, operator-key.pem.
	OperatorKey string
	// Server is the ctrl server certificate, server.pem.
	Server string
	// ServerKey is the ctrl server private key, server-key.pem.
	ServerKey string
}

// DevPathsIn returns the paths of the development PKI of the ctrl data
// directory dataDir: dataDir/pki/{ca,ca-key,operator,operator-key,server,
// server-key}.pem. It does not touch the file system.
func DevPathsIn(dataDir string) DevPaths {
	return pathsInDir(filepath.Join(dataDir, "pki"))
}

func pathsInDir(dir string) DevPaths {
	return DevPaths{
		Dir:         dir,
		CA:          filepath.Join(dir, "ca.pem"),
		CAKey:       filepath.Join(dir, "ca-key.pem"),
		Operator:    filepath.Join(dir, "operator.pem"),
		OperatorKey: filepath.Join(dir, "operator-key.pem"),
		Server:      filepath.Join(dir, "server.pem"),
		ServerKey:   filepath.Join(dir, "server-key.pem"),
	}
}

// EnsureDev creates the development PKI of the ctrl data directory dataDir on
// first use and reuses it afterwards; it returns the paths of its files.
//
// The PKI consists of a self-signed CA (valid DevCAValidity), an operator
// client certificate (common name DevOperatorCommonName, role RoleOperator,
// valid DevOperatorValidity) and a server certificate for hosts (valid
// DevLeafValidity). hosts are
// DNS names and IP literals (an IPv6 literal may be bracketed); "localhost",
// "127.0.0.1" and "::1" are always included.
//
// On first use the whole PKI is built in a temporary directory next to
// dataDir/pki (mode 0700) and renamed into place, so a crash never leaves a
// half-built PKI (at worst a stray .pki-tmp-* directory, which may be
// deleted). Afterwards EnsureDev only reads, except to repair:
//
//   - if the server certificate does not cover every one of hosts, or does
//     not verify against the CA, or does not match its key, a new server
//     certificate is issued (for the union of its previous names and hosts;
//     its key is kept when it is intact); nothing else changes;
//   - if the operator certificate or its key is missing, or they do not
//     match, or the certificate does not verify against the CA (it expired,
//     say), or it is valid for longer than DevOperatorValidity from now (an
//     earlier release issued it for five years), a new operator pair is
//     issued with the existing CA;
//   - if the CA certificate is missing but its key exists, the CA certificate
//     is re-created from that key; its subject and key identifier derive from
//     the key, so certificates issued earlier keep verifying;
//   - if the CA key is missing but the CA certificate exists, or the CA pair
//     is unusable (mismatched, expired, not a CA), EnsureDev returns an error
//     and changes nothing: silently replacing a CA would invalidate every
//     certificate it issued.
//
// Every file is written atomically, keys with mode 0600. EnsureDev is not
// meant to run concurrently with itself on the same dataDir in several
// processes, except for the initial creation, which is race-free.
func EnsureDev(dataDir string, hosts []string) (DevPaths, error) {
	if dataDir == "" {
		return DevPaths{}, errors.New("pki: EnsureDev: empty data directory")
	}
	dnsNames, ips, err := normalizeHosts(hosts)
	if err != nil {
		return DevPaths{}, err
	}
	p := DevPathsIn(dataDir)
	now := time.Now()

	info, err := os.Stat(p.Dir)
	switch {
	case err == nil:
		if !info.IsDir() {
			return DevPaths{}, fmt.Errorf("pki: %s is not a directory", p.Dir)
		}
	case errors.Is(err, os.ErrNotExist):
		created, err := createDev(dataDir, p.Dir, dnsNames, ips, now)
		if err != nil {
			return DevPaths{}, err
		}
		if created {
			return p, nil
		}
		// Another process created the directory first: fall through and
		// check (and complete) what it made.
	default:
		return DevPaths{}, fmt.Errorf("pki: %w", err)
	}
	if err := completeDev(p, dnsNames, ips, now); err != nil {
		return DevPaths{}, err
	}
	return p, nil
}

// createDev builds a complete PKI in a temporary directory and renames it to
// dir. It reports false, without error, if dir appeared in the meantime.
func createDev(dataDir, dir string, dnsNames []string, ips []net.IP, now time.Time) (created bool, err error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return false, fmt.Errorf("pki: %w", err)
	}
	tmp, err := os.MkdirTemp(dataDir, ".pki-tmp-*") // mode 0700
	if err != nil {
		return false, fmt.Errorf("pki: %w", err)
	}
	defer func() {
		if !created {
			_ = os.RemoveAll(tmp)
		}
	}()
	if err := completeDev(pathsInDir(tmp), dnsNames, ips, now); err != nil {
		return false, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(dir); statErr == nil {
			return false, nil
		}
		return false, fmt.Errorf("pki: %w", err)
	}
	syncDir(dataDir)
	return true, nil
}

// completeDev checks the PKI in p.Dir and creates or repairs what is missing
// or unusable, as documented on EnsureDev.
func completeDev(p DevPaths, dnsNames []string, ips []net.IP, now time.Time) error {
	ca, err := ensureCA(p, now)
	if err != nil {
		return err
	}
	if err := ensureOperator(p, ca, now); err != nil {
		return err
	}
	return ensureServer(p, ca, dnsNames, ips, now)
}

func ensureCA(p DevPaths, now time.Time) (*authority, error) {
	haveCert, err := fileExists(p.CA)
	if err != nil {
		return nil, err
	}
	haveKey, err := fileExists(p.CAKey)
	if err != nil {
		return nil, err
	}
	switch {
	case haveCert && haveKey:
		ca, err := loadAuthority(p.CA, p.CAKey, now)
		if err != nil {
			return nil, fmt.Errorf("%w (the development CA in %s is unusable; "+
				"removing that directory creates a new PKI, which invalidates every certificate issued by the old CA)", err, p.Dir)
		}
		return ca, nil

	case haveCert:
		return nil, fmt.Errorf("pki: CA certificate %s exists but its private key %s is missing; "+
			"restore the key, or remove %s to create a new PKI (which invalidates every certificate issued by the old CA)",
			p.CA, p.CAKey, p.Dir)

	case haveKey:
		key, err := readPrivateKey(p.CAKey)
		if err != nil {
			return nil, fmt.Errorf("%w (CA certificate %s is missing too)", err, p.CA)
		}
		return writeCA(p, key, now)

	default:
		key, err := newKey()
		if err != nil {
			return nil, err
		}
		keyPEM, err := encodePrivateKey(key)
		if err != nil {
			return nil, err
		}
		defer clear(keyPEM)
		// Key first: a crash before the certificate is written leaves the
		// "key without certificate" state, which the next run completes.
		if err := writeFileAtomic(p.CAKey, keyPEM, 0o600); err != nil {
			return nil, err
		}
		return writeCA(p, key, now)
	}
}

// writeCA self-signs a CA certificate for key and writes it to p.CA.
func writeCA(p DevPaths, key crypto.Signer, now time.Time) (*authority, error) {
	der, cert, err := selfSignCA(key, now)
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(p.CA, encodeCertificate(der), 0o644); err != nil {
		return nil, err
	}
	return newAuthority(cert, key, p.CA, now)
}

func ensureOperator(p DevPaths, ca *authority, now time.Time) error {
	cert, _, err := loadLeaf(p.Operator, p.OperatorKey, ca, x509.ExtKeyUsageClientAuth, now)
	if err != nil {
		return err
	}
	if cert != nil && !cert.NotAfter.After(now.Add(DevOperatorValidity+clockSkew)) {
		return nil
	}
	return issuePair(ca, leafSpec{
		commonName: DevOperatorCommonName,
		ou:         []string{RoleOperator},
		usage:      x509.ExtKeyUsageClientAuth,
		validity:   DevOperatorValidity,
	}, p.Operator, p.OperatorKey, now)
}

func ensureServer(p DevPaths, ca *authority, dnsNames []string, ips []net.IP, now time.Time) error {
	cert, key, err := loadLeaf(p.Server, p.ServerKey, ca, x509.ExtKeyUsageServerAuth, now)
	if err != nil {
		return err
	}
	spec := leafSpec{
		commonName: devServerCommonName,
		usage:      x509.ExtKeyUsageServerAuth,
		dnsNames:   dnsNames,
		ips:        ips,
		validity:   DevLeafValidity,
	}
	if cert == nil {
		return issuePair(ca, spec, p.Server, p.ServerKey, now)
	}
	if covers(cert, dnsNames, ips) {
		return nil
	}
	// Keep the names the certificate had, so that clients using them keep
	// working, and keep the intact key: only server.pem changes.
	spec.dnsNames, spec.ips = unionHosts(dnsNames, ips, cert.DNSNames, cert.IPAddresses)
	der, err := ca.issue(spec, key.Public(), now)
	if err != nil {
		return err
	}
	return writeFileAtomic(p.Server, encodeCertificate(der), 0o644)
}

// loadLeaf loads a certificate and its key. It returns a nil certificate,
// without error, when either file is missing or unusable: unparsable, not
// matching each other, or not verifying against ca for usage at now. It
// returns an error only when a file exists but cannot be read.
func loadLeaf(certPath, keyPath string, ca *authority, usage x509.ExtKeyUsage, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	for _, path := range []string{certPath, keyPath} {
		ok, err := fileExists(path)
		if err != nil || !ok {
			return nil, nil, err
		}
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: %w", err)
	}
	certs, err := parseCertificates(certPEM, certPath)
	if err != nil {
		return nil, nil, nil
	}
	key, err := readPrivateKey(keyPath)
	if err != nil {
		if _, ok := errors.AsType[*os.PathError](err); ok {
			return nil, nil, err // unreadable, as opposed to malformed
		}
		return nil, nil, nil
	}
	cert := certs[0]
	if !publicKeysEqual(cert.PublicKey, key.Public()) || ca.verify(cert, usage, now) != nil {
		return nil, nil, nil
	}
	return cert, key, nil
}

// normalizeHosts splits hosts, plus the default hosts, into DNS names and IP
// addresses, without duplicates.
func normalizeHosts(hosts []string) ([]string, []net.IP, error) {
	var dnsNames []string
	var ips []net.IP
	for _, h := range slices.Concat(defaultHosts, hosts) {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
			h = h[1 : len(h)-1]
		}
		if ip := net.ParseIP(h); ip != nil {
			if !slices.ContainsFunc(ips, ip.Equal) {
				ips = append(ips, ip)
			}
			continue
		}
		name := strings.TrimSuffix(strings.ToLower(h), ".")
		if err := checkDNSName(name); err != nil {
			return nil, nil, err
		}
		if !slices.Contains(dnsNames, name) {
			dnsNames = append(dnsNames, name)
		}
	}
	return dnsNames, ips, nil
}

// checkDNSName rejects names that cannot be a DNS subject alternative name,
// such as a "host:port" pair or a URL given by mistake.
func checkDNSName(name string) error {
	if name == "" || len(name) > 253 {
		return fmt.Errorf("pki: invalid host name %q", name)
	}
	for i, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("pki: invalid host name %q", name)
		}
		if label == "*" && i == 0 {
			continue
		}
		for _, c := range label {
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("pki: invalid host name %q: want a DNS name or an IP address (no port, scheme or path)", name)
			}
		}
	}
	return nil
}

// covers reports whether cert names every one of dnsNames and ips exactly.
func covers(cert *x509.Certificate, dnsNames []string, ips []net.IP) bool {
	for _, name := range dnsNames {
		if !slices.ContainsFunc(cert.DNSNames, func(n string) bool { return strings.EqualFold(n, name) }) {
			return false
		}
	}
	for _, ip := range ips {
		if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// unionHosts returns dnsNames and ips followed by the names of oldDNS and
// oldIPs they lack.
func unionHosts(dnsNames []string, ips []net.IP, oldDNS []string, oldIPs []net.IP) ([]string, []net.IP) {
	outDNS := slices.Clone(dnsNames)
	for _, name := range oldDNS {
		name = strings.ToLower(name)
		if !slices.Contains(outDNS, name) {
			outDNS = append(outDNS, name)
		}
	}
	outIPs := slices.Clone(ips)
	for _, ip := range oldIPs {
		if !slices.ContainsFunc(outIPs, ip.Equal) {
			outIPs = append(outIPs, ip)
		}
	}
	return outDNS, outIPs
}
