package socks5

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
)

// TLSClient wraps conn (a connection to the proxy) in TLS and completes the
// handshake within ctx, for SOCKS5 inside TLS. serverName is both the SNI and
// the name verified: the Egress's server_name, or else its endpoint host.
// caPEM, when not empty, replaces the system roots.
func TLSClient(ctx context.Context, conn net.Conn, serverName string, caPEM []byte) (*tls.Conn, error) {
	if serverName == "" {
		return nil, fmt.Errorf("%w: TLS needs a server name", ErrInvalidRequest)
	}
	cfg := &tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12}
	if len(caPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, errors.New("socks5: ca_cert holds no PEM certificate")
		}
		cfg.RootCAs = pool
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("socks5: TLS handshake with the proxy: %w", err)
	}
	return tc, nil
}
