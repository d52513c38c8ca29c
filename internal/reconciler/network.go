package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
)

// This file is the network side of the reconciler: the NetworkConfig each
// running PUBLIC_INTERNET Workspace's desired state carries (its policy with
// the Egresses and Resolver it references, secrets included: it goes only
// on the node's stream), the network_policy_status derived from reports,
// how a policy change's command ends, the generation bump that makes
// running Workspaces take an Egress's or Resolver's new revision, and the
// broadcast of deleted Egresses.

// maxReportedEgresses bounds the Egress statuses kept from one report: a
// policy references at most netpolicy.MaxRoutes + 1 Egresses.
const maxReportedEgresses = 64

// maxIDBytes bounds an Egress ID taken from a report.
const maxIDBytes = 128

// resKey names a stored resource.
type resKey struct {
	kind store.ResourceKind
	id   string
}

// netReader reads, within one store transaction, the Egresses and
// Resolvers that desired network configurations reference, each once
// however many Workspaces reference it.
type netReader struct {
	ctx       context.Context
	tx        store.Tx
	log       *slog.Logger
	egresses  map[string]*nodev1.NetworkEgress   // nil: absent or unreadable
	resolvers map[string]*nodev1.NetworkResolver // likewise
}

func newNetReader(ctx context.Context, tx store.Tx, log *slog.Logger) *netReader {
	return &netReader{ctx: ctx, tx: tx, log: log,
		egresses: map[string]*nodev1.NetworkEgress{}, resolvers: map[string]*nodev1.NetworkResolver{}}
}

// resource reads one resource; nil when it does not exist.
func (n *netReader) resource(k resKey) (*store.Resource, error) {
	r, err := n.tx.GetResource(n.ctx, k.kind, k.id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	return r, err
}

// egress returns the Egress id as a node applies it (nil when it is gone or
// its row does not decode). Only a store failure is an error.
func (n *netReader) egress(id string) (*nodev1.NetworkEgress, error) {
	if e, ok := n.egresses[id]; ok {
		return e, nil
	}
	r, err := n.resource(resKey{store.KindEgress, id})
	if err != nil {
		return nil, err
	}
	var e *nodev1.NetworkEgress
	if r != nil {
		spec := &ctrlv1.EgressSpec{}
		if err := proto.Unmarshal(r.Spec, spec); err != nil {
			// The error of a decode says where, never what: no secret in it.
			n.log.Error("stored egress does not decode: its destinations are refused", "egress_id", id, "error", err.Error())
		} else {
			e = &nodev1.NetworkEgress{EgressId: id, Revision: r.Revision, Spec: spec, DrainSeconds: r.DrainSeconds}
		}
	}
	n.egresses[id] = e
	return e, nil
}

// resolver is egress for Resolvers.
func (n *netReader) resolver(id string) (*nodev1.NetworkResolver, error) {
	if v, ok := n.resolvers[id]; ok {
		return v, nil
	}
	r, err := n.resource(resKey{store.KindResolver, id})
	if err != nil {
		return nil, err
	}
	var v *nodev1.NetworkResolver
	if r != nil {
		spec := &ctrlv1.ResolverSpec{}
		if err := proto.Unmarshal(r.Spec, spec); err != nil {
			n.log.Error("stored resolver does not decode: DNS queries are refused", "resolver_id", id, "error", err.Error())
		} else {
			v = &nodev1.NetworkResolver{ResolverId: id, Revision: r.Revision, Spec: spec}
		}
	}
	n.resolvers[id] = v
	return v, nil
}

// policyEgresses returns the Egresses a policy references, each once: its
// routes' in order, then dns.via_egress_id.
func policyEgresses(p *ctrlv1.NetworkPolicy) []string {
	var out []string
	add := func(id string) {
		if id != "" && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	for _, r := range p.GetEgresses() {
		add(r.GetEgressId())
	}
	add(p.GetDns().GetViaEgressId())
	return out
}

// networkConfig is the network of a Workspace's desired state: its
// expected policy with the Egresses and Resolver it references, for a
// Workspace desired RUNNING with a PUBLIC_INTERNET policy; nil (mode NONE)
// otherwise. A referenced object that no longer exists is left out (the
// node then refuses what would have gone through it) and logged.
func (n *netReader) networkConfig(w *store.Workspace, pub *ctrlv1.Workspace) (*nodev1.NetworkConfig, error) {
	pol := pub.GetNetworkPolicy()
	if w.Power != store.PowerRunning || pol.GetMode() != ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET {
		return nil, nil
	}
	cfg := &nodev1.NetworkConfig{Policy: proto.CloneOf(pol), DrainSeconds: w.PolicyDrainSeconds}
	for _, id := range policyEgresses(pol) {
		e, err := n.egress(id)
		if err != nil {
			return nil, err
		}
		if e == nil {
			n.log.Warn("network policy references an egress that does not exist: what it routes is refused",
				"workspace_id", w.ID, "egress_id", id)
			continue
		}
		cfg.Egresses = append(cfg.Egresses, e)
	}
	if id := pol.GetDns().GetResolverId(); id != "" {
		v, err := n.resolver(id)
		if err != nil {
			return nil, err
		}
		if v == nil {
			n.log.Warn("network policy references a resolver that does not exist: DNS queries are refused",
				"workspace_id", w.ID, "resolver_id", id)
		}
		cfg.Resolver = v
	}
	return cfg, nil
}

// boundedNetwork returns net with its message within its bound and at most
// maxReportedEgresses Egress statuses with bounded IDs (a copy when
// something had to change).
func boundedNetwork(net *nodev1.NetworkStatus) *nodev1.NetworkStatus {
	if net == nil {
		return nil
	}
	msg := nodewire.Cut(net.GetMessage(), nodewire.MaxNetworkMessageBytes)
	ok := msg == net.GetMessage() && len(net.GetEgresses()) <= maxReportedEgresses
	for _, e := range net.GetEgresses() {
		ok = ok && len(e.GetEgressId()) <= maxIDBytes
	}
	if ok {
		return net
	}
	out := proto.CloneOf(net)
	out.Message = msg
	out.Egresses = nil
	for _, e := range net.GetEgresses() {
		if len(out.Egresses) == maxReportedEgresses {
			break
		}
		if len(e.GetEgressId()) <= maxIDBytes {
			out.Egresses = append(out.Egresses, e)
		}
	}
	return out
}

// networkStatus derives a running execution's network_policy_status from
// the expected policy and what the report's network says:
//
//   - NONE (or no policy): APPLIED at the policy's revision once running
//     (every execution has loopback only from its start), FAILED when the
//     node says applying it failed.
//   - PUBLIC_INTERNET: APPLIED when the node applies the expected revision,
//     FAILED (with the node's message) when applying it failed, PENDING
//     while the node applies an earlier one or reports no network at all
//     (a node that does not serve networks).
//
// The Egress statuses are the report's, for the Egresses the expected
// policy references, each once.
func networkStatus(pol *ctrlv1.NetworkPolicy, net *nodev1.NetworkStatus) *ctrlv1.NetworkPolicyStatus {
	rev := pol.GetRevision()
	st := &ctrlv1.NetworkPolicyStatus{AppliedRevision: net.GetAppliedRevision()}
	switch {
	case net.GetFailed():
		st.State, st.Message = ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_FAILED, net.GetMessage()
	case pol.GetMode() != ctrlv1.NetworkMode_NETWORK_MODE_PUBLIC_INTERNET:
		st.State, st.AppliedRevision = ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED, rev
	case net != nil && net.GetAppliedRevision() == rev:
		st.State = ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED
	default:
		st.State = ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_PENDING
	}
	refs := policyEgresses(pol)
	for _, e := range net.GetEgresses() {
		id := e.GetEgressId()
		if !slices.Contains(refs, id) || slices.ContainsFunc(st.Egresses, func(x *ctrlv1.EgressStatus) bool { return x.GetEgressId() == id }) {
			continue
		}
		st.Egresses = append(st.Egresses, &ctrlv1.EgressStatus{EgressId: id, AppliedRevision: e.GetAppliedRevision()})
	}
	return st
}

// policyChangeOutcome is how the running report of a policy change's
// generation ends its command (UpdateWorkspaceNetworkPolicy on an
// AVAILABLE Workspace), given the status networkStatus derived:
//
//   - APPLIED: success.
//   - FAILED: failed_precondition, reason EXECUTION_FAILED, stage
//     "network_policy", not retryable: the node keeps the previous policy
//     and the same change cannot succeed as it is (a new policy, or a fixed
//     Egress or Resolver, can).
//   - no network in the report while the policy is PUBLIC_INTERNET: the
//     node does not serve networks: failed_precondition, reason
//     CAPABILITY_UNAVAILABLE.
//   - PENDING with a network: not done; the node reports again once it
//     applied or failed the revision (UpdateWorkspaceNetworkPolicy's own
//     bound ends the wait otherwise).
func policyChangeOutcome(pol *ctrlv1.NetworkPolicy, net *nodev1.NetworkStatus, st *ctrlv1.NetworkPolicyStatus) outcome {
	switch st.GetState() {
	case ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_APPLIED:
		return outcome{done: true}
	case ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_FAILED:
		msg := fmt.Sprintf("the node could not apply network policy revision %d", pol.GetRevision())
		if m := st.GetMessage(); m != "" {
			msg += ": " + m
		}
		return outcome{done: true, err: &fault.Error{Kind: fault.KindFailedPrecondition, Reason: fault.ReasonExecutionFailed,
			Stage: "network_policy", Message: msg + "; the previous policy stays in effect"}}
	}
	if net == nil {
		return outcome{done: true, err: &fault.Error{Kind: fault.KindFailedPrecondition, Reason: fault.ReasonCapabilityUnavailable,
			Stage: "network_policy", Message: "the workspace's node does not serve workspace networks; the previous policy stays in effect"}}
	}
	return outcome{}
}

// redactSecrets replaces in a node's text every password of the Egresses
// pol references: the node should never quote one, and ctrl makes sure no
// response or stored status does.
func redactSecrets(ctx context.Context, tx store.Tx, pol *ctrlv1.NetworkPolicy, text string) (string, error) {
	if text == "" {
		return text, nil
	}
	for _, id := range policyEgresses(pol) {
		r, err := tx.GetResource(ctx, store.KindEgress, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return "", err
		}
		spec := &ctrlv1.EgressSpec{}
		if proto.Unmarshal(r.Spec, spec) != nil {
			continue
		}
		if p := spec.GetSocks5().GetPassword(); p != "" {
			text = strings.ReplaceAll(text, p, "[redacted]")
		}
	}
	return text, nil
}

// Repush makes the running Workspaces whose policy references targetID with
// one of kinds take its new revision: it bumps their Generation, without
// touching their CommandID, so that the reconciler pushes their desired
// state again. Call it in the transaction that changed the Egress or
// Resolver (UpdateEgress, UpdateResolver), then Kick.
//
// A Workspace counts when it is placed, not deleted, desired RUNNING and
// either has a command in flight or runs (observed RUNNING or STARTING): a
// new generation of a Workspace whose start failed would start it again.
// It returns how many Workspaces it bumped.
func Repush(ctx context.Context, tx store.Tx, targetID string, kinds ...store.RefKind) (int, error) {
	var ids []string
	for _, k := range kinds {
		refs, err := tx.ReferencingWorkspaces(ctx, k, targetID)
		if err != nil {
			return 0, err
		}
		for _, id := range refs {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	n := 0
	for _, id := range ids {
		w, err := tx.GetWorkspace(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return n, err
		}
		runs := w.ObservedState == store.ExecRunning || w.ObservedState == store.ExecStarting
		if !w.DeletedAt.IsZero() || w.NodeID == "" || w.Power != store.PowerRunning || (w.CommandID == "" && !runs) {
			continue
		}
		w.Generation++
		if err := tx.UpdateWorkspace(ctx, w); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// EgressDeleted tells every node that an Egress was deleted, so that each
// closes at once the connections still draining through it
// (DesiredState.deleted_egress_ids); the full state of a node that connects
// within the next hour names it too (recentIDs). DeleteEgress calls it
// after its commit.
func (r *Reconciler) EgressDeleted(id string) {
	r.notifyAll(&r.deleted, id, func(nc *nodeConn) *[]string { return &nc.deletedEgresses })
}

// ServesNetwork reports whether a known node serves workspace networks
// (Hello.features has nodewire.FeatureNetwork): the capabilities of the
// network data path are served then.
func (r *Reconciler) ServesNetwork() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.features {
		if f[nodewire.FeatureNetwork] {
			return true
		}
	}
	return false
}

// featureSet is a Hello's features as a set.
func featureSet(list []string) map[string]bool {
	m := make(map[string]bool, len(list))
	for _, f := range list {
		m[f] = true
	}
	return m
}
