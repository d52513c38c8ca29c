package netpolicy

import (
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
)

// seedPolicies are the policies of the unit tests, encoded: the fuzzers'
// in-code seeds (testdata/fuzz holds more).
func seedPolicies(f *testing.F) [][]byte {
	var out [][]byte
	for _, tc := range decideCases() {
		b, err := proto.Marshal(tc.p)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// FuzzValidate: Validate never panics; a refusal is a fault naming a field
// of the policy; what it accepts compiles, equals itself and its
// normalized form, and the normalized form is valid too.
func FuzzValidate(f *testing.F) {
	for _, b := range seedPolicies(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p := &ctrlv1.NetworkPolicy{}
		if proto.Unmarshal(b, p) != nil {
			return
		}
		err := Validate("network_policy", p)
		if err != nil {
			fe, ok := fault.As(err)
			if !ok || !strings.HasPrefix(fe.Field, "network_policy") ||
				(fe.Kind != fault.KindInvalidArgument && fe.Kind != fault.KindNotFound) {
				t.Fatalf("Validate = %#v, want invalid_argument or not_found naming a field", err)
			}
			if len(fe.Message) > 1024 {
				t.Fatalf("Validate's message is %d bytes", len(fe.Message))
			}
			return
		}
		if _, err := Compile(p); err != nil {
			t.Fatalf("Compile = %v after Validate accepted", err)
		}
		n := Normalize(p)
		if err := Validate("network_policy", n); err != nil {
			t.Fatalf("Validate(Normalize(p)) = %v", err)
		}
		if !Equal(p, p) || !Equal(p, n) || !Equal(n, p) {
			t.Fatalf("Equal is not reflexive or Normalize changed the content: %v vs %v", p, n)
		}
		if !proto.Equal(Normalize(n), n) {
			t.Fatalf("Normalize is not idempotent: %v vs %v", Normalize(n), n)
		}
	})
}

// FuzzDecide: Decide agrees with a plain reading of the rules, which
// parses each destination again and walks every list.
func FuzzDecide(f *testing.F) {
	for _, b := range seedPolicies(f) {
		for _, tc := range decideCases() {
			a := ap(tc.dst)
			f.Add(b, a.Addr().AsSlice(), a.Port())
		}
	}
	f.Fuzz(func(t *testing.T, b, addr []byte, port uint16) {
		p := &ctrlv1.NetworkPolicy{}
		if proto.Unmarshal(b, p) != nil {
			return
		}
		a, ok := netip.AddrFromSlice(addr)
		if !ok {
			return
		}
		pol, err := Compile(p)
		if err != nil {
			return
		}
		dst := netip.AddrPortFrom(a, port)
		if got, want := pol.Decide(dst), oracle(p, dst); got != want {
			t.Fatalf("Decide(%s) = %+v, want %+v under %v", dst, got, want, p)
		}
	})
}

// oracle decides as the package doc says, from the messages.
func oracle(p *ctrlv1.NetworkPolicy, dst netip.AddrPort) Decision {
	mode := p.GetMode()
	if mode != ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET {
		return Decision{Verdict: Refuse}
	}
	a := dst.Addr().Unmap()
	covers := func(d *ctrlv1.Destination) bool {
		pr := netip.MustParsePrefix(d.GetCidr())
		if pr.Addr().Is4() != a.Is4() || !pr.Contains(a) {
			return false
		}
		all := d.GetPortMin() == 0 && d.GetPortMax() == 0
		return all || (uint32(dst.Port()) >= d.GetPortMin() && uint32(dst.Port()) <= d.GetPortMax())
	}
	for _, d := range p.GetDeny() {
		if covers(d) {
			return Decision{Verdict: Refuse}
		}
	}
	if len(p.GetAllow()) > 0 {
		admitted := false
		for _, d := range p.GetAllow() {
			admitted = admitted || covers(d)
		}
		if !admitted {
			return Decision{Verdict: Refuse}
		}
	}
	for _, r := range p.GetEgresses() {
		for _, d := range r.GetDestinations() {
			if covers(d) {
				return Decision{Verdict: ViaEgress, EgressID: r.GetEgressId()}
			}
		}
	}
	return Decision{Verdict: Direct}
}
