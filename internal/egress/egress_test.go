package egress

import (
	"strings"
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
)

func socks(addr, user, pass string, tls *ctrlv1.EgressTls) *ctrlv1.EgressSpec {
	return &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{
		Address: addr, Username: user, Password: pass, Tls: tls}}}
}

// TestValidateSpec: the syntax rules of an Egress spec, each with the field
// a refusal names, and never the password in a message.
func TestValidateSpec(t *testing.T) {
	const secret = "s3cret-canary"
	for _, tc := range []struct {
		name  string
		spec  *ctrlv1.EgressSpec
		field string // "" when valid
	}{
		{"valid without credentials", socks("198.51.100.7:1080", "", "", nil), ""},
		{"valid with credentials", socks("proxy.example:1080", "alice", secret, nil), ""},
		{"valid TLS server name", socks("proxy.example:1080", "", "", &ctrlv1.EgressTls{ServerName: "proxy.example"}), ""},
		{"no spec", nil, "spec"},
		{"no protocol", &ctrlv1.EgressSpec{}, "spec"},
		{"no port", socks("proxy.example", "", "", nil), "spec.socks5.address"},
		{"password without username", socks("proxy.example:1080", "", secret, nil), "spec.socks5.username"},
		{"username without password", socks("proxy.example:1080", "alice", "", nil), "spec.socks5.password"},
		{"username too long", socks("proxy.example:1080", strings.Repeat("u", MaxCredentialBytes+1), secret, nil), "spec.socks5.username"},
		{"password too long", socks("proxy.example:1080", "alice", secret+strings.Repeat("p", MaxCredentialBytes), nil), "spec.socks5.password"},
		{"server name with a slash", socks("proxy.example:1080", "", "", &ctrlv1.EgressTls{ServerName: "a/b"}), "spec.socks5.tls.server_name"},
		{"server name too long", socks("proxy.example:1080", "", "", &ctrlv1.EgressTls{ServerName: strings.Repeat("a", MaxServerNameBytes+1)}), "spec.socks5.tls.server_name"},
		{"CA that is not PEM", socks("proxy.example:1080", "", "", &ctrlv1.EgressTls{CaCert: "not pem"}), "spec.socks5.tls.ca_cert"},
		{"CA with a key block", socks("proxy.example:1080", "", "", &ctrlv1.EgressTls{CaCert: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}), "spec.socks5.tls.ca_cert"},
		{"CA too large", socks("proxy.example:1080", "", "", &ctrlv1.EgressTls{CaCert: strings.Repeat("x", MaxCACertBytes+1)}), "spec.socks5.tls.ca_cert"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateSpec("spec", tc.spec)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("ValidateSpec = %v, want valid", err)
				}
				return
			}
			fe, ok := fault.As(err)
			if !ok || fe.Kind != fault.KindInvalidArgument || fe.Field != tc.field {
				t.Fatalf("ValidateSpec = %v, want invalid_argument on %s", err, tc.field)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the refusal shows the password: %v", err)
			}
		})
	}
}

func TestValidateDrainSeconds(t *testing.T) {
	u := func(v uint32) *uint32 { return &v }
	for _, tc := range []struct {
		in   *uint32
		want uint32
		ok   bool
	}{
		{nil, DefaultDrainSeconds, true},
		{u(0), 0, true},
		{u(MaxDrainSeconds), MaxDrainSeconds, true},
		{u(MaxDrainSeconds + 1), 0, false},
	} {
		got, err := ValidateDrainSeconds("drain_seconds", tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("ValidateDrainSeconds(%v) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestRedact: reads never show the password, and redaction leaves the
// stored spec untouched.
func TestRedact(t *testing.T) {
	s := socks("proxy.example:1080", "alice", "pw", nil)
	r := Redact(s)
	if r.GetSocks5().GetPassword() != "" || r.GetSocks5().GetUsername() != "alice" {
		t.Fatalf("Redact = %v", r)
	}
	if s.GetSocks5().GetPassword() != "pw" {
		t.Fatal("Redact changed its argument")
	}
	if Redact(nil) != nil {
		t.Fatal("Redact(nil) != nil")
	}
	if SameContent(s, r) {
		t.Fatal("a spec and its redaction are the same content")
	}
}

func TestValidateResolverSpec(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spec  *ctrlv1.ResolverSpec
		field string
	}{
		{"udp", &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "9.9.9.9:53"}}}, ""},
		{"tcp", &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Tcp{Tcp: &ctrlv1.TcpResolver{Address: "dns.example:53"}}}, ""},
		{"none", &ctrlv1.ResolverSpec{}, "spec"},
		{"nil", nil, "spec"},
		{"udp without port", &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "9.9.9.9"}}}, "spec.udp.address"},
	} {
		err := ValidateResolverSpec("spec", tc.spec)
		fe, _ := fault.As(err)
		if (tc.field == "" && err != nil) || (tc.field != "" && (fe == nil || fe.Field != tc.field)) {
			t.Errorf("%s: ValidateResolverSpec = %v, want field %q", tc.name, err, tc.field)
		}
	}
}
