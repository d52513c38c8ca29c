package workspace

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/egress"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/netpolicy"
	"github.com/kibotos/kibotos/internal/store"
)

const updateNetworkPolicyMethod = "/kibotos.ctrl.v1.WorkspaceService/UpdateWorkspaceNetworkPolicy"

// policyStage names the stage of a policy update's failures.
const policyStage = "apply_network_policy"

// normalizePolicyInput clears network_policy.revision from a request's
// fingerprint: the server assigns it and ignores what the request says.
func normalizePolicyInput(p *ctrlv1.NetworkPolicy) {
	if p != nil {
		p.Revision = 0
	}
}

// checkReferences looks up the Egresses and the Resolver a policy
// references (field names the policy in the request): one that does not
// exist, or was deleted, is not_found naming the reference's field; a udp
// Resolver sent through an Egress without udp_enabled is
// failed_precondition. It returns the references to record.
func checkReferences(ctx context.Context, tx store.Tx, field string, p *ctrlv1.NetworkPolicy) ([]store.Reference, error) {
	egressSpec := func(f, id string) (*ctrlv1.EgressSpec, error) {
		r, err := tx.GetResource(ctx, store.KindEgress, id)
		if errors.Is(err, store.ErrNotFound) {
			fe := fault.NotFound("egress", id)
			fe.Field = f
			return nil, fe
		}
		if err != nil {
			return nil, err
		}
		spec := &ctrlv1.EgressSpec{}
		if err := proto.Unmarshal(r.Spec, spec); err != nil {
			return nil, fault.Internal("decode egress spec: %v", err)
		}
		return spec, nil
	}
	for i, r := range p.GetEgresses() {
		if _, err := egressSpec(fmt.Sprintf("%s.egresses[%d].egress_id", field, i), r.GetEgressId()); err != nil {
			return nil, err
		}
	}
	udp := false
	dns := p.GetDns()
	if id := dns.GetResolverId(); id != "" {
		r, err := tx.GetResource(ctx, store.KindResolver, id)
		if errors.Is(err, store.ErrNotFound) {
			fe := fault.NotFound("resolver", id)
			fe.Field = field + ".dns.resolver_id"
			return nil, fe
		}
		if err != nil {
			return nil, err
		}
		spec := &ctrlv1.ResolverSpec{}
		if err := proto.Unmarshal(r.Spec, spec); err != nil {
			return nil, fault.Internal("decode resolver spec: %v", err)
		}
		udp = spec.GetUdp() != nil
	}
	if id := dns.GetViaEgressId(); id != "" {
		f := field + ".dns.via_egress_id"
		spec, err := egressSpec(f, id)
		if err != nil {
			return nil, err
		}
		if udp && !spec.GetUdpEnabled() {
			fe := fault.Precondition(fault.ReasonConflict,
				"resolver %q is a udp resolver and egress %q does not have udp_enabled: its queries cannot go through it", dns.GetResolverId(), id)
			fe.Field = f
			return nil, fe
		}
	}
	return netpolicy.References(p, udp), nil
}

// UpdateNetworkPolicy serves UpdateWorkspaceNetworkPolicy (seed 000, the
// timing of seed 003):
//
//   - a non-zero expected_revision must equal network_policy.revision, even
//     for equal content (aborted, REVISION_MISMATCH);
//   - content equal to the current policy (netpolicy.Equal) succeeds with the
//     same revision, opens no command and involves no node;
//   - a STOPPED Workspace records the policy: revision+1, references,
//     status PENDING; the next start applies it;
//   - an AVAILABLE Workspace whose execution reported no DNS configuration
//     version (one started by an earlier release) refuses a policy that
//     references a Resolver (failed_precondition); otherwise the new
//     revision is recorded with drain_seconds and a new generation for the
//     node, and the call waits for the node's confirmation or failure up to
//     WaitBound (one minute); past it the answer is retryable:
//     deadline_exceeded (TIMED_OUT), or unavailable (NODE_UNREACHABLE) when
//     the Workspace is UNKNOWN because its node fell silent, and the policy
//     status is UNKNOWN until the node reports;
//   - any other state is failed_precondition (STATE_CONFLICT).
//
// Every refusal stores nothing and leaves the running policy as it was.
func (s *Service) UpdateNetworkPolicy(ctx context.Context, req *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) (*ctrlv1.UpdateWorkspaceNetworkPolicyResponse, error) {
	id := req.GetWorkspaceId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	if err := netpolicy.Validate("network_policy", req.GetNetworkPolicy()); err != nil {
		return nil, err
	}
	drain, err := egress.ValidateDrainSeconds("drain_seconds", req.DrainSeconds)
	if err != nil {
		return nil, err
	}
	out, err := command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.UpdateWorkspaceNetworkPolicyRequest, *ctrlv1.UpdateWorkspaceNetworkPolicyResponse]{
		Method: updateNetworkPolicyMethod, ObjectKind: ObjectKind, ObjectID: id,
		CommandKind: int(ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_NETWORK_POLICY), Request: req,
		Normalize: func(r *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) { normalizePolicyInput(r.GetNetworkPolicy()) },
		NewResponse: func() *ctrlv1.UpdateWorkspaceNetworkPolicyResponse {
			return &ctrlv1.UpdateWorkspaceNetworkPolicyResponse{}
		},
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (*ctrlv1.UpdateWorkspaceNetworkPolicyResponse, error) {
			return s.decidePolicy(ctx, tx, rec, req, drain)
		},
	})
	// The reconciler pushes the new desired state now, not at its next
	// tick: this call waits for the node (a deferred kick would run only
	// after that wait, ~1 s later). The admission may also have superseded
	// the Workspace's previous command: wake its waiters.
	s.kick()
	s.Store.Notify(store.WorkspaceTopic(id))
	if err != nil {
		return nil, err
	}
	c := out.GetCommand()
	if c.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING {
		return out, nil // equal content, or recorded on a STOPPED Workspace
	}
	return s.awaitPolicy(ctx, id, c.GetCommandId())
}

// decidePolicy is the admission of a policy update, inside its
// transaction.
func (s *Service) decidePolicy(ctx context.Context, tx store.Tx, rec *store.Command, req *ctrlv1.UpdateWorkspaceNetworkPolicyRequest, drain uint32) (*ctrlv1.UpdateWorkspaceNetworkPolicyResponse, error) {
	w, pub, err := s.load(ctx, tx, req.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	st := status(w, pub)
	if st.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING || st.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		// Not even equal content: the policy of a deleted Workspace is gone.
		return nil, observed(Admit(OpUpdateNetworkPolicy, st), pub)
	}
	cur := pub.GetNetworkPolicy()
	if exp := req.GetExpectedRevision(); exp != 0 && exp != cur.GetRevision() {
		return nil, observed(fault.RevisionMismatch("expected_revision", exp, cur.GetRevision()), pub)
	}
	if netpolicy.Equal(cur, req.GetNetworkPolicy()) {
		rec.Kind = 0 // no command opened: GetWorkspaceCommand does not list it
		return &ctrlv1.UpdateWorkspaceNetworkPolicyResponse{Workspace: pub}, nil
	}
	if err := Admit(OpUpdateNetworkPolicy, st); err != nil {
		return nil, observed(err, pub)
	}
	next := netpolicy.Normalize(req.GetNetworkPolicy())
	refs, err := checkReferences(ctx, tx, "network_policy", next)
	if err != nil {
		return nil, observed(err, pub)
	}
	running := st.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
	if running && w.ExecDNSVersion == 0 && next.GetDns().GetResolverId() != "" {
		fe := fault.Precondition(fault.ReasonStateConflict,
			"the running execution uses the DNS configuration an earlier release started it with, which cannot use a resolver; stop and start the workspace first")
		fe.Field, fe.Stage = "network_policy.dns.resolver_id", policyStage
		return nil, observed(fe, pub)
	}
	now := s.now()
	next.Revision = cur.GetRevision() + 1
	pub.NetworkPolicy = next
	ps := proto.CloneOf(pub.GetNetworkPolicyStatus())
	if ps == nil {
		ps = &ctrlv1.NetworkPolicyStatus{}
	}
	ps.State, ps.Message = ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_PENDING, ""
	pub.NetworkPolicyStatus = ps
	w.PolicyDrainSeconds = drain
	if err := tx.SetReferences(ctx, w.ID, refs); err != nil {
		return nil, err
	}
	if running {
		// A policy update still waiting for the node is superseded.
		if w.CommandID != "" && w.CommandID != rec.ID {
			if err := Supersede(ctx, tx, w.CommandID, rec.ID, now); err != nil {
				return nil, err
			}
		}
		w.Generation++
		w.CommandID = rec.ID
		rec.Status = store.CommandProcessing
	}
	if err := Save(w, pub, now); err != nil {
		return nil, err
	}
	if err := tx.UpdateWorkspace(ctx, w); err != nil {
		return nil, err
	}
	if running {
		return &ctrlv1.UpdateWorkspaceNetworkPolicyResponse{Workspace: pub, Command: acceptance(rec)}, nil
	}
	return &ctrlv1.UpdateWorkspaceNetworkPolicyResponse{Workspace: pub, Command: CommandMessage(rec)}, nil
}

// awaitPolicy waits, as StopWorkspace does, for the node to confirm or
// fail the policy command cmdID of Workspace wsID. A Workspace that is
// UNKNOWN (its node fell silent) is answered at once.
func (s *Service) awaitPolicy(ctx context.Context, wsID, cmdID string) (*ctrlv1.UpdateWorkspaceNetworkPolicyResponse, error) {
	var pub *ctrlv1.Workspace
	if err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		_, pub, err = s.load(ctx, tx, wsID)
		return err
	}); err != nil {
		return nil, err
	}
	var (
		rec  *store.Command
		done bool
		err  error
	)
	if pub.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN {
		rec, done, err = s.await(ctx, cmdID, wsID, s.bound())
		if err != nil {
			return nil, err
		}
	}
	if !done {
		if rec, done, err = s.policyUnsettled(ctx, wsID, cmdID); err != nil {
			return nil, err
		}
	}
	if rec.ErrorCode != "" {
		return nil, fault.Decode(rec.ErrorCode, rec.ErrorDetail)
	}
	// The command completed: the reconciler records the final response, or
	// the Workspace as it is now is the answer.
	out := &ctrlv1.UpdateWorkspaceNetworkPolicyResponse{}
	if proto.Unmarshal(rec.Result, out) == nil &&
		out.GetCommand().GetStatus() == ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
		return out, nil
	}
	final, err := s.Get(ctx, wsID)
	if err != nil {
		return nil, err
	}
	return &ctrlv1.UpdateWorkspaceNetworkPolicyResponse{Workspace: final, Command: CommandMessage(rec)}, nil
}

// policyUnsettled handles a policy command the node did not settle in
// time: unless it completed meanwhile, the policy status becomes UNKNOWN
// (until the node reports) and the answer is retryable: unavailable
// (NODE_UNREACHABLE) when the Workspace is UNKNOWN, deadline_exceeded
// (TIMED_OUT) otherwise. done reports a command that completed after all.
func (s *Service) policyUnsettled(ctx context.Context, wsID, cmdID string) (rec *store.Command, done bool, err error) {
	unreachable := false
	err = s.Store.InTx(ctx, func(tx store.Tx) error {
		if rec, err = tx.GetCommand(ctx, cmdID); err != nil {
			return err
		}
		if done = rec.Status == store.CommandCompleted; done {
			return nil
		}
		w, pub, err := s.load(ctx, tx, wsID)
		if err != nil {
			return err
		}
		unreachable = pub.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN
		if w.CommandID != cmdID || pub.GetNetworkPolicyStatus().GetState() == ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_UNKNOWN {
			return nil
		}
		ps := proto.CloneOf(pub.GetNetworkPolicyStatus())
		if ps == nil {
			ps = &ctrlv1.NetworkPolicyStatus{}
		}
		ps.State = ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_UNKNOWN
		pub.NetworkPolicyStatus = ps
		if err := Save(w, pub, s.now()); err != nil {
			return err
		}
		return tx.UpdateWorkspace(ctx, w)
	})
	switch {
	case err != nil:
		return nil, false, err
	case done:
		return rec, true, nil
	case unreachable:
		fe := &fault.Error{Kind: fault.KindUnavailable, Reason: fault.ReasonNodeUnreachable, Retryable: true, Stage: policyStage,
			Message: fmt.Sprintf("the node of workspace %q is not reachable; command %q goes on: resend the same command ID or read GetWorkspaceCommand", wsID, cmdID)}
		return nil, false, fe
	}
	fe := &fault.Error{Kind: fault.KindDeadlineExceeded, Reason: fault.ReasonTimedOut, Retryable: true, Stage: policyStage,
		Message: fmt.Sprintf("the node has not confirmed command %q within %s; it goes on: resend the same command ID or read GetWorkspaceCommand", cmdID, s.bound())}
	return nil, false, fe
}

// bound is how long stop, delete and a policy update wait for the node.
func (s *Service) bound() time.Duration {
	if s.WaitBound > 0 {
		return s.WaitBound
	}
	return time.Minute
}
