package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// TestNetworkDNSVersionEarlierRelease: a running execution whose record
// says nothing of its DNS configuration (as an earlier release wrote it)
// is adopted by a restarted node, which reports DNS configuration version
// 0; ctrl then refuses a policy naming a Resolver (failed_precondition,
// STATE_CONFLICT, field network_policy.dns.resolver_id) and changes
// neither the expected nor the applied policy, while a policy without a
// Resolver is still applied. After a stop and a start the execution is
// this release's and the same policy is applied, its DNS answered through
// the Resolver.
func TestNetworkDNSVersionEarlierRelease(t *testing.T) {
	e := newNetEnv(t)
	name := "dnsversion.kibotos.test"
	e.dns.Set(name, e.dnsPeer.Addr)
	rs := e.mustResolver(&ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: e.dns.Addr.String()}}})
	withResolver := publicPolicy(nil, nil)
	withResolver.Dns = &ctrlv1.DnsConfig{ResolverId: rs.GetResolverId()}

	w := e.workspace(publicPolicy(nil, nil))
	record := filepath.Join(e.nodeRoot, "exec", w.id+".json")

	// The node stops as for an upgrade; the execution runs on and its
	// record is made one an earlier release wrote.
	must(t, e.node.term(15*time.Second))
	dropDNSVersion(t, record)
	must(t, e.node.start())
	w.waitExec()
	e.waitWS(w.id, 60*time.Second, "AVAILABLE with its policy applied after the node restarted", func(ws *ctrlv1.Workspace) bool {
		st := ws.GetNetworkPolicyStatus()
		return ws.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE && st.GetState() == ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED &&
			st.GetAppliedRevision() == ws.GetNetworkPolicy().GetRevision()
	})
	// A policy without a Resolver: applied by the restarted node, whose
	// report of it carries the adopted execution's DNS version (0).
	denyOne := publicPolicy(nil, []*ctrlv1.Destination{dest("10.231.255.0/24")})
	e.mustSetPolicy(w.id, denyOne, nil)

	before := e.getWS(w.id)
	_, err := e.setPolicy(w.id, withResolver, nil)
	d := detailOf(err)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || d.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_STATE_CONFLICT ||
		d.GetField() != "network_policy.dns.resolver_id" {
		t.Fatalf("a Resolver for an execution an earlier release started: %v (detail %v), want failed_precondition STATE_CONFLICT on network_policy.dns.resolver_id", err, d)
	}
	if d.GetObservedWorkspace().GetWorkspaceId() != w.id {
		t.Errorf("the refusal's observed_workspace is %v", d.GetObservedWorkspace())
	}
	after := e.getWS(w.id)
	if !proto.Equal(after.GetNetworkPolicy(), before.GetNetworkPolicy()) {
		t.Errorf("the expected policy changed with the refusal:\nbefore %v\nafter  %v", before.GetNetworkPolicy(), after.GetNetworkPolicy())
	}
	if !proto.Equal(after.GetNetworkPolicyStatus(), before.GetNetworkPolicyStatus()) {
		t.Errorf("the applied status changed with the refusal:\nbefore %v\nafter  %v", before.GetNetworkPolicyStatus(), after.GetNetworkPolicyStatus())
	}
	if out, _ := w.probe("dns", name); !strings.HasPrefix(out, name+" REFUSED") {
		t.Errorf("DNS after the refusal: %q, want REFUSED (no Resolver applied)", out)
	}
	// Still accepted without a Resolver.
	e.mustSetPolicy(w.id, publicPolicy(nil, nil), nil)

	// A stop and a start: an execution of this release.
	ws := e.getWS(w.id)
	if _, err := e.ws.StopWorkspace(t.Context(), connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Metadata: e.cmdID("stop"), WorkspaceId: w.id,
		ExpectedExpirationRevision: ws.GetExpiration().GetRevision()})); err != nil {
		t.Fatalf("StopWorkspace: %v", err)
	}
	ws = e.waitWS(w.id, 30*time.Second, "STOPPED", func(ws *ctrlv1.Workspace) bool {
		return ws.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED
	})
	if _, err := e.ws.StartWorkspace(t.Context(), connect.NewRequest(&ctrlv1.StartWorkspaceRequest{Metadata: e.cmdID("start"), WorkspaceId: w.id,
		ExpectedExpirationRevision: ws.GetExpiration().GetRevision()})); err != nil {
		t.Fatalf("StartWorkspace: %v", err)
	}
	w.waitReady()
	if v := recordedDNSVersion(t, record); v != nodewire.DNSConfigVersion {
		t.Errorf("the new execution's record has dns_version %d, want %d", v, nodewire.DNSConfigVersion)
	}
	w.install(w.tok, e.probe, "/tmp/netprobe")

	e.mustSetPolicy(w.id, withResolver, nil)
	queries := len(e.dns.QueriesFor(name))
	for _, args := range [][]string{{"dns", name}, {"dns", "-tcp", name}} {
		if out, _ := w.probe(args...); strings.TrimSpace(out) != name+" NOERROR "+e.dnsPeer.Addr.String() {
			t.Errorf("netprobe %q through the Resolver: %q", args, out)
		}
	}
	if out := w.mustRun(w.tok, "nslookup", name); !strings.Contains(out, e.dnsPeer.Addr.String()) {
		t.Errorf("busybox nslookup through the Resolver: %q", out)
	}
	if n := len(e.dns.QueriesFor(name)); n <= queries {
		t.Errorf("the Resolver saw no query for %s", name)
	}
}

// dropDNSVersion rewrites the execution record at path as an earlier
// release wrote it: the same fields in the same order and format, without
// dns_version (which must be this release's). It replaces the file
// atomically, with its mode.
func dropDNSVersion(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	fi, err := os.Stat(path)
	must(t, err)
	if v := recordedDNSVersion(t, path); v != nodewire.DNSConfigVersion {
		t.Fatalf("the execution record has dns_version %d, want %d:\n%s", v, nodewire.DNSConfigVersion, b)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("the execution record is not an object: %v %v", tok, err)
	}
	var compact bytes.Buffer
	compact.WriteByte('{')
	for dec.More() {
		tok, err := dec.Token()
		must(t, err)
		var raw json.RawMessage
		must(t, dec.Decode(&raw))
		if tok == "dns_version" {
			continue
		}
		key, err := json.Marshal(tok)
		must(t, err)
		if compact.Len() > 1 {
			compact.WriteByte(',')
		}
		fmt.Fprintf(&compact, "%s:%s", key, raw)
	}
	compact.WriteByte('}')
	var out bytes.Buffer
	must(t, json.Indent(&out, compact.Bytes(), "", "  "))
	out.WriteByte('\n')

	// The rest is unchanged.
	var old, now map[string]any
	must(t, json.Unmarshal(b, &old))
	must(t, json.Unmarshal(out.Bytes(), &now))
	delete(old, "dns_version")
	if !reflect.DeepEqual(old, now) {
		t.Fatalf("rewriting the record changed more than dns_version:\n%s\n%s", b, out.Bytes())
	}

	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	must(t, err)
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(out.Bytes())
	if err == nil {
		err = tmp.Chmod(fi.Mode().Perm())
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	must(t, err)
	must(t, os.Rename(tmp.Name(), path))
	if v := recordedDNSVersion(t, path); v != 0 {
		t.Fatalf("the rewritten record still has dns_version %d", v)
	}
}

// recordedDNSVersion is the dns_version of the execution record at path
// (0: absent).
func recordedDNSVersion(t *testing.T, path string) uint32 {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	var r struct {
		DNSVersion uint32 `json:"dns_version"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("execution record %s: %v", path, err)
	}
	return r.DNSVersion
}
