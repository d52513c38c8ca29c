// Package egress holds the rules of Egresses and Resolvers: what a valid
// spec is, which endpoint checks it must pass, what reads may show of it, and
// when two specs are the same content.
//
// It is pure domain code: it knows the API messages but no transport and no
// SQL. Endpoint checks are delegated to internal/netguard.
package egress

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/netguard"
)

// Limits of an Egress spec.
const (
	// MaxCACertBytes is the largest accepted tls.ca_cert.
	MaxCACertBytes = 64 << 10
	// MaxCredentialBytes is the RFC 1929 limit of username and password.
	MaxCredentialBytes = 255
	// MaxServerNameBytes is the longest DNS name accepted as SNI.
	MaxServerNameBytes = 253
	// MaxDrainSeconds is the largest drain_seconds.
	MaxDrainSeconds = 3600
	// DefaultDrainSeconds applies when drain_seconds is absent.
	DefaultDrainSeconds = 600
)

// ValidateSpec checks an Egress spec's syntax. field is the request field
// that holds it ("spec"). It does not resolve names: see CheckEndpoints.
func ValidateSpec(field string, s *ctrlv1.EgressSpec) error {
	if s == nil {
		return fault.Invalid(field, "spec is required")
	}
	socks := s.GetSocks5()
	if socks == nil {
		return fault.Invalid(field, "exactly one protocol must be selected (socks5)")
	}
	f := field + ".socks5"
	if _, _, err := netguard.ParseHostPort(f+".address", socks.GetAddress()); err != nil {
		return err
	}
	user, pass := socks.GetUsername(), socks.GetPassword()
	switch {
	case user == "" && pass != "":
		return fault.Invalid(f+".username", "username is required when a password is given (RFC 1929)")
	case user != "" && pass == "":
		return fault.Invalid(f+".password", "password is required when a username is given (RFC 1929)")
	case len(user) > MaxCredentialBytes:
		return fault.Invalid(f+".username", "username is %d bytes, at most %d are allowed", len(user), MaxCredentialBytes)
	case len(pass) > MaxCredentialBytes:
		// The length is safe to report; the value never is.
		return fault.Invalid(f+".password", "password is %d bytes, at most %d are allowed", len(pass), MaxCredentialBytes)
	}
	if t := socks.GetTls(); t != nil {
		if err := validateTLS(f+".tls", t); err != nil {
			return err
		}
	}
	return nil
}

func validateTLS(field string, t *ctrlv1.EgressTls) error {
	if sn := t.GetServerName(); sn != "" {
		if len(sn) > MaxServerNameBytes || strings.ContainsAny(sn, " /:\\\x00") {
			return fault.Invalid(field+".server_name", "server_name must be a DNS name of at most %d bytes", MaxServerNameBytes)
		}
	}
	ca := t.GetCaCert()
	if ca == "" {
		return nil
	}
	if len(ca) > MaxCACertBytes {
		return fault.Invalid(field+".ca_cert", "ca_cert is %d bytes, at most %d are allowed", len(ca), MaxCACertBytes)
	}
	rest := []byte(ca)
	n := 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return fault.Invalid(field+".ca_cert", "ca_cert may hold only CERTIFICATE blocks, found %q", b.Type)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fault.Invalid(field+".ca_cert", "certificate %d does not parse: %v", n+1, err)
		}
		n++
	}
	if n == 0 || strings.TrimSpace(string(rest)) != "" {
		return fault.Invalid(field+".ca_cert", "ca_cert must be PEM-encoded certificates")
	}
	return nil
}

// ValidateDrainSeconds checks the optional drain_seconds and returns the
// effective value.
func ValidateDrainSeconds(field string, v *uint32) (uint32, error) {
	if v == nil {
		return DefaultDrainSeconds, nil
	}
	if *v > MaxDrainSeconds {
		return 0, fault.Invalid(field, "drain_seconds is %d, it must be 0 to %d", *v, MaxDrainSeconds)
	}
	return *v, nil
}

// CheckEndpoint applies the special-purpose address check to an Egress's
// endpoint, resolving a name once.
func CheckEndpoint(ctx context.Context, c *netguard.Checker, field string, s *ctrlv1.EgressSpec) error {
	return c.CheckEndpoint(ctx, field+".socks5.address", s.GetSocks5().GetAddress())
}

// Redact returns a copy of s that reads may show: without the password.
func Redact(s *ctrlv1.EgressSpec) *ctrlv1.EgressSpec {
	if s == nil {
		return nil
	}
	c := proto.Clone(s).(*ctrlv1.EgressSpec)
	if socks := c.GetSocks5(); socks != nil {
		socks.Password = ""
	}
	return c
}

// SameContent reports whether two specs are equal, password included.
func SameContent(a, b *ctrlv1.EgressSpec) bool { return proto.Equal(a, b) }

// ValidateResolverSpec checks a Resolver spec's syntax.
func ValidateResolverSpec(field string, s *ctrlv1.ResolverSpec) error {
	if s == nil {
		return fault.Invalid(field, "spec is required")
	}
	f, addr, ok := resolverAddress(field, s)
	if !ok {
		return fault.Invalid(field, "exactly one protocol must be selected (udp or tcp)")
	}
	_, _, err := netguard.ParseHostPort(f, addr)
	return err
}

// CheckResolverEndpoint applies the special-purpose address check to a
// Resolver's address.
func CheckResolverEndpoint(ctx context.Context, c *netguard.Checker, field string, s *ctrlv1.ResolverSpec) error {
	f, addr, _ := resolverAddress(field, s)
	return c.CheckEndpoint(ctx, f, addr)
}

func resolverAddress(field string, s *ctrlv1.ResolverSpec) (string, string, bool) {
	switch p := s.GetProtocol().(type) {
	case *ctrlv1.ResolverSpec_Udp:
		return field + ".udp.address", p.Udp.GetAddress(), p.Udp != nil
	case *ctrlv1.ResolverSpec_Tcp:
		return field + ".tcp.address", p.Tcp.GetAddress(), p.Tcp != nil
	}
	return "", "", false
}

// UDPInUse refuses turning udp_enabled off while a policy sends a udp
// Resolver's queries through the Egress.
func UDPInUse(id string, n int) error {
	return fault.Precondition(fault.ReasonConflict,
		"%s", fmt.Sprintf("egress %q carries udp resolver queries for %d non-deleted workspace(s); udp_enabled cannot be turned off", id, n))
}
