package reconciler

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// secret is the Egress password of these tests: it may appear only in the
// desired state sent on a node's stream, never in a log, a stored
// Workspace or a command.
const secret = "s3cr3t-pa55word"

const (
	npPending = ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_PENDING
	npApplied = ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED
	npFailed  = ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_FAILED
	npUnknown = ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_UNKNOWN
	public    = ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET
	kPolicy   = ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_NETWORK_POLICY
)

// logBuffer collects a Reconciler's logs.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newLoggedTest is newTest with the logs kept; the test fails when they
// ever contain the secret.
func newLoggedTest(t *testing.T) (*Reconciler, store.Store, *fakeClock, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	r, st, clock := newTest(t, Config{Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	t.Cleanup(func() {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("the logs contain the Egress password:\n%s", logs.String())
		}
	})
	return r, st, clock, logs
}

func egressSpec(addr string) *ctrlv1.EgressSpec {
	return &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: addr, Username: "u", Password: secret}},
		UdpEnabled: true}
}

// putResource stores an Egress or Resolver as internal/catalog does (the
// spec deterministically encoded).
func putResource(t *testing.T, st store.Store, kind store.ResourceKind, id string, rev uint64, drain uint32, spec proto.Message) {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	err = st.InTx(t.Context(), func(tx store.Tx) error {
		r := &store.Resource{Kind: kind, ID: id, CreatedAt: t0, UpdatedAt: t0, Revision: rev, Spec: b, DrainSeconds: drain,
			LabelsRevision: 1, AnnotationsRevision: 1}
		if _, err := tx.GetResource(t.Context(), kind, id); err == nil {
			return tx.UpdateResource(t.Context(), r)
		}
		return tx.InsertResource(t.Context(), r)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// setPolicy gives a seeded Workspace a policy, its drain and its references.
func setPolicy(t *testing.T, st store.Store, id string, pol *ctrlv1.NetworkPolicy, drain uint32) {
	t.Helper()
	err := st.InTx(t.Context(), func(tx store.Tx) error {
		w, err := tx.GetWorkspace(t.Context(), id)
		if err != nil {
			return err
		}
		pub, err := workspace.Decode(w)
		if err != nil {
			return err
		}
		pub.NetworkPolicy = pol
		w.PolicyDrainSeconds = drain
		if err := workspace.Save(w, pub, t0); err != nil {
			return err
		}
		var refs []store.Reference
		for _, e := range policyEgresses(pol) {
			refs = append(refs, store.Reference{Kind: store.RefEgress, TargetID: e})
		}
		if id := pol.GetDns().GetResolverId(); id != "" {
			refs = append(refs, store.Reference{Kind: store.RefResolver, TargetID: id})
		}
		if err := tx.SetReferences(t.Context(), id, refs); err != nil {
			return err
		}
		return tx.UpdateWorkspace(t.Context(), w)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func route(egress string, cidrs ...string) *ctrlv1.EgressRoute {
	r := &ctrlv1.EgressRoute{EgressId: egress}
	for _, c := range cidrs {
		r.Destinations = append(r.Destinations, &ctrlv1.Destination{Cidr: c})
	}
	return r
}

// publicPolicy routes 198.51.100.0/24 through eg-a, 203.0.113.0/24 through
// eg-gone (which does not exist) and 192.0.2.0/24 through eg-a again, and
// sends DNS to rs-1 through eg-a.
func publicPolicy(rev uint64) *ctrlv1.NetworkPolicy {
	return &ctrlv1.NetworkPolicy{Revision: rev, Mode: public,
		Deny:     []*ctrlv1.Destination{{Cidr: "198.51.100.7/32"}},
		Egresses: []*ctrlv1.EgressRoute{route("eg-a", "198.51.100.0/24"), route("eg-gone", "203.0.113.0/24"), route("eg-a", "192.0.2.0/24")},
		Dns:      &ctrlv1.DnsConfig{ResolverId: "rs-1", ViaEgressId: "eg-a"}}
}

// sentStates drains nc's stream and returns the last desired state sent of
// each Workspace.
func sentStates(nc *nodeConn) map[string]*nodev1.DesiredWorkspace {
	out := map[string]*nodev1.DesiredWorkspace{}
	for {
		select {
		case m := <-nc.send:
			for _, d := range m.GetDesired().GetWorkspaces() {
				out[d.GetWorkspaceId()] = d
			}
		default:
			return out
		}
	}
}

// TestDesiredNetwork: a running PUBLIC_INTERNET Workspace's desired state
// carries its expected policy, its drain, each referenced Egress once with
// its revision, full spec (password included) and drain, and its Resolver;
// a referenced Egress that is gone is left out and logged (without any
// secret). The full state of a connecting node carries the same.
func TestDesiredNetwork(t *testing.T) {
	r, st, _, logs := newLoggedTest(t)
	nc := connectNode(t, r, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	putResource(t, st, store.KindEgress, "eg-a", 3, 45, egressSpec("egress.example:1080"))
	resolver := &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "dns.example:53"}}}
	putResource(t, st, store.KindResolver, "rs-1", 2, 0, resolver)
	seed(t, st, t0, row{id: "ws-net", node: "n1", power: running, generation: 2, observed: 1, exec: store.ExecRunning, state: wsAvail})
	setPolicy(t, st, "ws-net", publicPolicy(4), 120)
	seed(t, st, t0, row{id: "ws-none", node: "n1", power: running, generation: 2, observed: 1, exec: store.ExecRunning, state: wsAvail})

	if err := r.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := &nodev1.NetworkConfig{
		Policy: publicPolicy(4), DrainSeconds: 120,
		Egresses: []*nodev1.NetworkEgress{{EgressId: "eg-a", Revision: 3, Spec: egressSpec("egress.example:1080"), DrainSeconds: 45}},
		Resolver: &nodev1.NetworkResolver{ResolverId: "rs-1", Revision: 2, Spec: resolver},
	}
	sent := sentStates(nc)
	if sent["ws-net"] == nil || sent["ws-none"] == nil {
		t.Fatalf("sent %v, want ws-net and ws-none", sent)
	}
	if diff := cmp.Diff(want, sent["ws-net"].GetNetwork(), protocmp.Transform()); diff != "" {
		t.Errorf("pushed network (-want +got):\n%s", diff)
	}
	if got := sent["ws-none"].GetNetwork(); got != nil {
		t.Errorf("a NONE Workspace's network = %v, want none", got)
	}
	if !strings.Contains(logs.String(), "eg-gone") {
		t.Errorf("the missing Egress was not logged:\n%s", logs.String())
	}

	full, err := r.fullState(t.Context(), nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range full.GetDesired().GetWorkspaces() {
		if d.GetWorkspaceId() == "ws-net" {
			if diff := cmp.Diff(want, d.GetNetwork(), protocmp.Transform()); diff != "" {
				t.Errorf("full state network (-want +got):\n%s", diff)
			}
		}
	}

	// Stopping: no network in the desired state (nothing to apply, and no
	// secret sent for nothing).
	err = st.InTx(t.Context(), func(tx store.Tx) error {
		w, err := tx.GetWorkspace(t.Context(), "ws-net")
		if err != nil {
			return err
		}
		w.Power, w.Generation = store.PowerStopped, w.Generation+1
		return tx.UpdateWorkspace(t.Context(), w)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := sentStates(nc)["ws-net"]; got.GetPower() != nodev1.Power_POWER_STOPPED || got.GetNetwork() != nil {
		t.Errorf("stopping: power %v network %v, want STOPPED and none", got.GetPower(), got.GetNetwork())
	}

	// Nothing the reconciler stored holds the password.
	w, _ := load(t, st, "ws-net")
	if bytes.Contains(w.Doc, []byte(secret)) {
		t.Error("the stored Workspace holds the Egress password")
	}
}

// TestNetworkStatus is the table of network_policy_status against the
// expected policy and a running execution's reported network.
func TestNetworkStatus(t *testing.T) {
	none := &ctrlv1.NetworkPolicy{Revision: 3, Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}
	pub := publicPolicy(5)
	egs := []*ctrlv1.EgressStatus{{EgressId: "eg-a", AppliedRevision: 2}, {EgressId: "eg-x", AppliedRevision: 9},
		{EgressId: "eg-a", AppliedRevision: 7}, {EgressId: "eg-gone", AppliedRevision: 1}}
	for _, tc := range []struct {
		name string
		pol  *ctrlv1.NetworkPolicy
		net  *nodev1.NetworkStatus
		want *ctrlv1.NetworkPolicyStatus
	}{
		{"none, older node", none, nil, &ctrlv1.NetworkPolicyStatus{AppliedRevision: 3, State: npApplied}},
		{"none, network node", none, &nodev1.NetworkStatus{DnsConfigVersion: 1}, &ctrlv1.NetworkPolicyStatus{AppliedRevision: 3, State: npApplied}},
		{"no policy", nil, nil, &ctrlv1.NetworkPolicyStatus{State: npApplied}},
		{"none, failed", none, &nodev1.NetworkStatus{AppliedRevision: 2, Failed: true, Message: "tap busy"},
			&ctrlv1.NetworkPolicyStatus{AppliedRevision: 2, State: npFailed, Message: "tap busy"}},
		{"public, older node", pub, nil, &ctrlv1.NetworkPolicyStatus{State: npPending}},
		{"public, applied", pub, &nodev1.NetworkStatus{AppliedRevision: 5, Egresses: egs},
			&ctrlv1.NetworkPolicyStatus{AppliedRevision: 5, State: npApplied,
				Egresses: []*ctrlv1.EgressStatus{{EgressId: "eg-a", AppliedRevision: 2}, {EgressId: "eg-gone", AppliedRevision: 1}}}},
		{"public, earlier revision", pub, &nodev1.NetworkStatus{AppliedRevision: 4},
			&ctrlv1.NetworkPolicyStatus{AppliedRevision: 4, State: npPending}},
		{"public, nothing applied yet", pub, &nodev1.NetworkStatus{}, &ctrlv1.NetworkPolicyStatus{State: npPending}},
		{"public, failed", pub, &nodev1.NetworkStatus{AppliedRevision: 4, Failed: true, Message: "egress eg-a: no address"},
			&ctrlv1.NetworkPolicyStatus{AppliedRevision: 4, State: npFailed, Message: "egress eg-a: no address"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, networkStatus(tc.pol, tc.net), protocmp.Transform()); diff != "" {
				t.Errorf("networkStatus (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPolicyChange: the running report of a policy change's generation
// completes its command when the node applied the revision, fails it when
// the node could not (the password never quoted) or does not serve
// networks, and leaves it in flight while the node still applies an
// earlier revision. A report of a start command's generation completes it
// whatever the network says. The DNS configuration version is recorded
// from every report.
func TestPolicyChange(t *testing.T) {
	type want struct {
		completed bool
		code      string // the command's error code once completed
		reason    ctrlv1.FailureReason
		state     ctrlv1.NetworkPolicyState
		applied   uint64
		dns       uint32
	}
	for _, tc := range []struct {
		name string
		kind ctrlv1.WorkspaceCommandKind
		pol  *ctrlv1.NetworkPolicy
		net  *nodev1.NetworkStatus
		want want
	}{
		{"applied", kPolicy, publicPolicy(5), &nodev1.NetworkStatus{AppliedRevision: 5, DnsConfigVersion: 1},
			want{completed: true, state: npApplied, applied: 5, dns: 1}},
		{"still the earlier revision", kPolicy, publicPolicy(5), &nodev1.NetworkStatus{AppliedRevision: 4, DnsConfigVersion: 1},
			want{state: npPending, applied: 4, dns: 1}},
		{"failed", kPolicy, publicPolicy(5), &nodev1.NetworkStatus{AppliedRevision: 4, Failed: true, Message: "dial eg-a as u:" + secret + " refused", DnsConfigVersion: 1},
			want{completed: true, code: "failed_precondition", reason: ctrlv1.FailureReason_FAILURE_REASON_EXECUTION_FAILED, state: npFailed, applied: 4, dns: 1}},
		{"node without networks", kPolicy, publicPolicy(5), nil,
			want{completed: true, code: "failed_precondition", reason: ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE, state: npPending}},
		{"to NONE on a node without networks", kPolicy, &ctrlv1.NetworkPolicy{Revision: 6, Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}, nil,
			want{completed: true, state: npApplied, applied: 6}},
		{"to NONE", kPolicy, &ctrlv1.NetworkPolicy{Revision: 6, Mode: ctrlv1.NetworkMode_NETWORK_MODE_NONE}, &nodev1.NetworkStatus{AppliedRevision: 5, DnsConfigVersion: 1},
			want{completed: true, state: npApplied, applied: 6, dns: 1}},
		{"a start completes whatever the network says", ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_START, publicPolicy(5),
			&nodev1.NetworkStatus{AppliedRevision: 4}, want{completed: true, state: npPending, applied: 4}},
		{"an execution of an earlier release", ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_START, publicPolicy(5),
			&nodev1.NetworkStatus{AppliedRevision: 5}, want{completed: true, state: npApplied, applied: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, st, _, _ := newLoggedTest(t)
			putResource(t, st, store.KindEgress, "eg-a", 1, 600, egressSpec("egress.example:1080"))
			seed(t, st, t0, row{id: "ws-1", node: "n1", power: running, generation: 3, observed: 2, exec: store.ExecRunning,
				state: wsAvail, command: "c-3", kind: tc.kind})
			setPolicy(t, st, "ws-1", tc.pol, 30)
			completed, err := r.applyReport(t.Context(), "n1", 0, &nodev1.ExecutionReport{WorkspaceId: "ws-1", Generation: 3,
				State: exRun, HoldsExecution: true, Network: tc.net})
			if err != nil {
				t.Fatal(err)
			}
			w, pub := load(t, st, "ws-1")
			c := loadCommand(t, st, "c-3")
			got := want{completed: completed, code: c.ErrorCode, state: pub.GetNetworkPolicyStatus().GetState(),
				applied: pub.GetNetworkPolicyStatus().GetAppliedRevision(), dns: w.ExecDNSVersion}
			if c.ErrorCode != "" {
				fe := fault.Decode(c.ErrorCode, c.ErrorDetail)
				got.reason = fe.Detail().GetReason()
				if fe.Stage != "network_policy" || fe.Retryable {
					t.Errorf("failure %+v, want stage network_policy, not retryable", fe)
				}
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("after the report (-want +got):\n%s", diff)
			}
			if completed != (c.Status == store.CommandCompleted) || completed != (w.CommandID == "") {
				t.Errorf("completed %v, command status %v, row's command %q", completed, c.Status, w.CommandID)
			}
			if pub.GetState() != wsAvail {
				t.Errorf("state = %v, want AVAILABLE (the execution runs on)", pub.GetState())
			}
			if bytes.Contains(w.Doc, []byte(secret)) || bytes.Contains(c.ErrorDetail, []byte(secret)) {
				t.Errorf("the node's message reached the store with the password: %q", pub.GetNetworkPolicyStatus().GetMessage())
			}
			if tc.want.state == npFailed && !strings.Contains(pub.GetNetworkPolicyStatus().GetMessage(), "[redacted]") {
				t.Errorf("status message %q, want the node's with the password redacted", pub.GetNetworkPolicyStatus().GetMessage())
			}
		})
	}
}

// TestNetworkReportBounds: a node's network message and Egress statuses
// are cut to their bounds.
func TestNetworkReportBounds(t *testing.T) {
	net := &nodev1.NetworkStatus{Failed: true, Message: strings.Repeat("m", 1<<20)}
	for i := range 1000 {
		net.Egresses = append(net.Egresses, &ctrlv1.EgressStatus{EgressId: "eg-a", AppliedRevision: uint64(i)})
	}
	net.Egresses = append([]*ctrlv1.EgressStatus{{EgressId: strings.Repeat("x", 1<<16)}}, net.Egresses...)
	rep := bounded(&nodev1.ExecutionReport{Network: net})
	got := rep.GetNetwork()
	if len(got.GetMessage()) > nodewire.MaxNetworkMessageBytes || len(got.GetEgresses()) > maxReportedEgresses {
		t.Errorf("bounded network: message %d bytes, %d egresses", len(got.GetMessage()), len(got.GetEgresses()))
	}
	if got.GetEgresses()[0].GetEgressId() != "eg-a" {
		t.Errorf("an oversized Egress ID was kept")
	}
	if len(net.GetMessage()) != 1<<20 {
		t.Error("bounded changed the caller's report")
	}
	small := &nodev1.ExecutionReport{Network: &nodev1.NetworkStatus{AppliedRevision: 2}}
	if bounded(small) != small {
		t.Error("a report within its bounds was copied")
	}
}

// TestRepush: an Egress or Resolver update moves the generation of the
// Workspaces that reference it and run (or have a command in flight),
// without touching their command; the reconciler then pushes the new
// revision. Workspaces that are stopped, stopping, unplaced, deleted or
// whose start failed are left alone (a new generation would start them).
func TestRepush(t *testing.T) {
	r, st, _, _ := newLoggedTest(t)
	nc := connectNode(t, r, hello("n1", 8192, 4000, "", workspace.DefaultTemplate))
	putResource(t, st, store.KindEgress, "eg-a", 1, 600, egressSpec("egress.example:1080"))
	rows := []row{
		{id: "ws-run", node: "n1", power: running, generation: 2, observed: 2, exec: store.ExecRunning, state: wsAvail},
		{id: "ws-starting", node: "n1", power: running, generation: 2, observed: 2, exec: store.ExecStarting, state: wsStart},
		{id: "ws-cmd", node: "n1", power: running, generation: 3, observed: 2, exec: store.ExecStopped, state: wsStart,
			command: "c-start", kind: ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_START},
		{id: "ws-failed", node: "n1", power: running, generation: 2, observed: 2, exec: store.ExecFailed, state: wsFailed},
		{id: "ws-stopped", node: "n1", power: stopped, generation: 2, observed: 2, exec: store.ExecStopped, state: wsStoped},
		{id: "ws-unplaced", power: running, generation: 1, state: wsCreate, command: "c-create"},
		{id: "ws-other", node: "n1", power: running, generation: 2, observed: 2, exec: store.ExecRunning, state: wsAvail},
	}
	for _, rw := range rows {
		seed(t, st, t0, rw)
		if rw.id != "ws-other" {
			setPolicy(t, st, rw.id, publicPolicy(1), 600)
		}
	}
	before := map[string]*store.Workspace{}
	for _, rw := range rows {
		before[rw.id], _ = load(t, st, rw.id)
	}
	// What UpdateEgress does: the new revision and Repush in one
	// transaction.
	putResource(t, st, store.KindEgress, "eg-a", 2, 15, egressSpec("egress2.example:1080"))
	var n int
	err := st.InTx(t.Context(), func(tx store.Tx) (err error) {
		n, err = Repush(t.Context(), tx, "eg-a", store.RefEgress, store.RefEgressUDP)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	bumped := map[string]bool{"ws-run": true, "ws-starting": true, "ws-cmd": true}
	if n != len(bumped) {
		t.Errorf("Repush = %d, want %d", n, len(bumped))
	}
	for _, rw := range rows {
		w, _ := load(t, st, rw.id)
		want := before[rw.id].Generation
		if bumped[rw.id] {
			want++
		}
		if w.Generation != want || w.CommandID != before[rw.id].CommandID || !bytes.Equal(w.Doc, before[rw.id].Doc) {
			t.Errorf("%s: generation %d command %q (doc changed: %v); want generation %d, command %q, doc untouched",
				rw.id, w.Generation, w.CommandID, !bytes.Equal(w.Doc, before[rw.id].Doc), want, before[rw.id].CommandID)
		}
	}
	// The pass pushes the new revision with its drain to the running one.
	if err := r.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	d := sentStates(nc)["ws-run"]
	if d.GetGeneration() != 3 || len(d.GetNetwork().GetEgresses()) != 1 ||
		d.GetNetwork().GetEgresses()[0].GetRevision() != 2 || d.GetNetwork().GetEgresses()[0].GetDrainSeconds() != 15 ||
		d.GetNetwork().GetPolicy().GetRevision() != 1 {
		t.Errorf("pushed after the update: %v", d)
	}
}

// TestEgressDeleted: a deleted Egress reaches every connected node at once,
// and the full state of a node that connects within the hour names it.
func TestEgressDeleted(t *testing.T) {
	r, _, clock, _ := newLoggedTest(t)
	n1 := connectNode(t, r, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	n2 := connectNode(t, r, hello("n2", 4096, 4000, "", workspace.DefaultTemplate))
	r.EgressDeleted("eg-a")
	for _, nc := range []*nodeConn{n1, n2} {
		select {
		case m := <-nc.send:
			want := &nodev1.DesiredState{DeletedEgressIds: []string{"eg-a"}}
			if diff := cmp.Diff(want, m.GetDesired(), protocmp.Transform()); diff != "" {
				t.Errorf("%s: (-want +got):\n%s", nc.id, diff)
			}
		default:
			t.Errorf("%s was not told", nc.id)
		}
	}
	// A stream that is backed up gets it at the next pass.
	for len(n1.send) < cap(n1.send) {
		n1.send <- &nodev1.ConnectResponse{}
	}
	r.EgressDeleted("eg-b")
	if got := n1.deletedEgresses; len(got) != 1 || got[0] != "eg-b" {
		t.Errorf("pending on the backed-up stream: %v, want [eg-b]", got)
	}
	for len(n1.send) > 0 {
		<-n1.send
	}
	if err := r.pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if m := <-n1.send; !cmp.Equal(m.GetDesired().GetDeletedEgressIds(), []string{"eg-b"}) {
		t.Errorf("after the pass: %v, want [eg-b]", m.GetDesired())
	}

	clock.Set(t0.Add(30 * time.Minute))
	r.EgressDeleted("eg-c")
	full, err := r.fullState(t.Context(), connectNode(t, r, hello("n3", 4096, 4000, "", workspace.DefaultTemplate)))
	if err != nil {
		t.Fatal(err)
	}
	if got := full.GetDesired().GetDeletedEgressIds(); !cmp.Equal(got, []string{"eg-a", "eg-b", "eg-c"}) {
		t.Errorf("full state names %v, want eg-a, eg-b and eg-c", got)
	}
	clock.Set(t0.Add(time.Hour + time.Second))
	full, err = r.fullState(t.Context(), connectNode(t, r, hello("n4", 4096, 4000, "", workspace.DefaultTemplate)))
	if err != nil {
		t.Fatal(err)
	}
	if got := full.GetDesired().GetDeletedEgressIds(); !cmp.Equal(got, []string{"eg-c"}) {
		t.Errorf("an hour later the full state names %v, want eg-c", got)
	}
}

// TestServesNetwork: the network capabilities follow the known nodes'
// features, also after a restart (from the stored Hello).
func TestServesNetwork(t *testing.T) {
	r, st, _, _ := newLoggedTest(t)
	connectNode(t, r, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	if r.ServesNetwork() {
		t.Error("ServesNetwork with a node without the feature")
	}
	h := hello("n2", 4096, 4000, "", workspace.DefaultTemplate)
	h.Features = []string{"something-else", nodewire.FeatureNetwork}
	connectNode(t, r, h)
	if !r.ServesNetwork() {
		t.Error("ServesNetwork = false with a node that serves networks")
	}
	restarted := New(Config{Store: st})
	if err := restarted.loadNodes(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !restarted.ServesNetwork() {
		t.Error("a restarted reconciler forgot the node's features")
	}
	if c := restarted.connected(); len(c) != 0 {
		t.Errorf("connected after a restart: %v", c)
	}
}

// TestMarkSilentNetworkUnknown: a silent node's running Workspaces' policy
// status turns UNKNOWN with them, keeping the applied revision; the next
// report resolves it.
func TestMarkSilentNetworkUnknown(t *testing.T) {
	r, st, clock, _ := newLoggedTest(t)
	connectNode(t, r, hello("n1", 4096, 4000, "", workspace.DefaultTemplate))
	seed(t, st, t0, row{id: "ws-1", node: "n1", power: running, generation: 2, observed: 2, exec: store.ExecRunning, state: wsAvail})
	setPolicy(t, st, "ws-1", publicPolicy(3), 600)
	if _, err := r.applyReport(t.Context(), "n1", 0, &nodev1.ExecutionReport{WorkspaceId: "ws-1", Generation: 2, State: exRun,
		HoldsExecution: true, Network: &nodev1.NetworkStatus{AppliedRevision: 3}, ObservedAt: timestamppb.New(t0)}); err != nil {
		t.Fatal(err)
	}
	clock.Set(t0.Add(time.Hour))
	if _, err := r.markSilent(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, pub := load(t, st, "ws-1")
	if s := pub.GetNetworkPolicyStatus(); pub.GetState() != wsUnk || s.GetState() != npUnknown || s.GetAppliedRevision() != 3 {
		t.Errorf("silent: state %v, status %v; want UNKNOWN, UNKNOWN at revision 3", pub.GetState(), s)
	}
	if _, err := r.applyReport(t.Context(), "n1", 0, &nodev1.ExecutionReport{WorkspaceId: "ws-1", Generation: 2, State: exRun,
		HoldsExecution: true, Network: &nodev1.NetworkStatus{AppliedRevision: 3}}); err != nil {
		t.Fatal(err)
	}
	if _, pub := load(t, st, "ws-1"); pub.GetState() != wsAvail || pub.GetNetworkPolicyStatus().GetState() != npApplied {
		t.Errorf("reported again: state %v, status %v; want AVAILABLE, APPLIED", pub.GetState(), pub.GetNetworkPolicyStatus())
	}
}
