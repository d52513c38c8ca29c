package workspace

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace/limits"
)

// The procedures of the configuration commands (part of their
// fingerprints: they never change).
const (
	updateMemoryMethod = "/kibotos.ctrl.v1.WorkspaceService/UpdateWorkspaceMemory"
	updateCPUMethod    = "/kibotos.ctrl.v1.WorkspaceService/UpdateWorkspaceCpu"
	resizeMethod       = "/kibotos.ctrl.v1.WorkspaceService/ResizeWorkspaceWritableLayer"
)

// The bounds UpdateWorkspaceMemory and UpdateWorkspaceCpu accept. Within
// them a value is recorded whatever the nodes offer: capacity is judged by
// the next start. Outside them it is invalid_argument.
const (
	// MinMemoryMiB is the smallest memory an execution starts with (the
	// node's sandbox refuses less).
	MinMemoryMiB = 16
	// MaxMemoryMiB is 1 TiB.
	MaxMemoryMiB = 1 << 20
	// MaxCPUMillis is 1024 vCPUs.
	MaxCPUMillis = 1024 * 1000
)

// ResizeStage names the stage of a writable layer resize's failures.
const ResizeStage = "resize_writable_layer"

// CheckMemory validates memory_mib: MinMemoryMiB to MaxMemoryMiB.
func CheckMemory(field string, mib uint32) error {
	if mib < MinMemoryMiB || mib > MaxMemoryMiB {
		return fault.Invalid(field, "%s must be from %d to %d MiB, not %d", field, MinMemoryMiB, MaxMemoryMiB, mib)
	}
	return nil
}

// CheckCPU validates cpu_millis: 1 to MaxCPUMillis.
func CheckCPU(field string, millis uint32) error {
	if millis == 0 || millis > MaxCPUMillis {
		return fault.Invalid(field, "%s must be from 1 to %d millicores, not %d", field, MaxCPUMillis, millis)
	}
	return nil
}

// CheckLayerCapacity validates a resize target: required, a whole number of
// MiB, at least limits.MinCapacityBytes.
func CheckLayerCapacity(field string, c uint64) error {
	switch {
	case c == 0:
		return fault.Invalid(field, "%s is required: the absolute capacity the writable layer must have", field)
	case c%limits.MiB != 0:
		return fault.Invalid(field, "%s %d is not a whole number of MiB", field, c)
	case c < limits.MinCapacityBytes:
		return fault.Invalid(field, "%s must be at least %d MiB", field, limits.MinCapacityBytes/limits.MiB)
	}
	return nil
}

// UpdateMemory serves UpdateWorkspaceMemory: see updateResources.
func (s *Service) UpdateMemory(ctx context.Context, req *ctrlv1.UpdateWorkspaceMemoryRequest) (*ctrlv1.UpdateWorkspaceMemoryResponse, error) {
	if err := CheckMemory("memory_mib", req.GetMemoryMib()); err != nil {
		return nil, err
	}
	v := req.GetMemoryMib()
	return updateResources(ctx, s, req, updateMemoryMethod, ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_MEMORY,
		req.GetWorkspaceId(), req.GetExpectedRevision(),
		func(r *ctrlv1.Resources) bool {
			if r.GetMemoryMib() == v {
				return false
			}
			r.MemoryMib = v
			return true
		},
		func(pub *ctrlv1.Workspace) *ctrlv1.UpdateWorkspaceMemoryResponse {
			return &ctrlv1.UpdateWorkspaceMemoryResponse{Workspace: pub}
		})
}

// UpdateCPU serves UpdateWorkspaceCpu: see updateResources.
func (s *Service) UpdateCPU(ctx context.Context, req *ctrlv1.UpdateWorkspaceCpuRequest) (*ctrlv1.UpdateWorkspaceCpuResponse, error) {
	if err := CheckCPU("cpu_millis", req.GetCpuMillis()); err != nil {
		return nil, err
	}
	v := req.GetCpuMillis()
	return updateResources(ctx, s, req, updateCPUMethod, ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_CPU,
		req.GetWorkspaceId(), req.GetExpectedRevision(),
		func(r *ctrlv1.Resources) bool {
			if r.GetCpuMillis() == v {
				return false
			}
			r.CpuMillis = v
			return true
		},
		func(pub *ctrlv1.Workspace) *ctrlv1.UpdateWorkspaceCpuResponse {
			return &ctrlv1.UpdateWorkspaceCpuResponse{Workspace: pub}
		})
}

// updateResources is UpdateWorkspaceMemory and UpdateWorkspaceCpu (seed
// 000): configuration for the next execution only, so one transaction
// records it and the command COMPLETED (initiator CALLER); no node is
// involved and the reconciler is not woken.
//
//   - Only a Workspace that holds no execution admits it (Admit with
//     OpUpdateConfig: STOPPED, and the FAILED a start may resume from);
//     any other state is failed_precondition (STATE_CONFLICT) with
//     observed_workspace.
//   - expected_revision must equal resources_revision, which memory and CPU
//     share: otherwise aborted (REVISION_MISMATCH) with observed_workspace,
//     and nothing changes. Of a memory and a CPU change sent against the
//     same revision, one lands and the other is aborted.
//   - The same value keeps resources_revision; a different one increments
//     it by one.
//   - Capacity is not judged here: the next start is (placement fails it
//     with CAPACITY_EXHAUSTED when its node cannot hold it).
//
// Every refusal is recorded with the command ID (settled) and changes
// nothing.
func updateResources[Req command.Input, Resp proto.Message](ctx context.Context, s *Service, req Req, method string,
	kind ctrlv1.WorkspaceCommandKind, id string, expected uint64, apply func(*ctrlv1.Resources) bool,
	respond func(*ctrlv1.Workspace) Resp) (Resp, error) {
	var zero Resp
	if err := validateID(id); err != nil {
		return zero, err
	}
	return command.Execute(ctx, s.Engine, command.Spec[Req, Resp]{
		Method: method, ObjectKind: ObjectKind, ObjectID: id, CommandKind: int(kind), Request: req,
		NewResponse: func() Resp { return respond(nil) },
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (Resp, error) {
			w, pub, err := s.load(ctx, tx, id)
			if err != nil {
				return zero, err
			}
			if err := Admit(OpUpdateConfig, status(w, pub)); err != nil {
				return zero, observed(err, pub)
			}
			if cur := pub.GetResourcesRevision(); cur != expected {
				return zero, observed(fault.RevisionMismatch("expected_revision", expected, cur), pub)
			}
			if pub.Resources == nil {
				pub.Resources = &ctrlv1.Resources{}
			}
			if apply(pub.Resources) {
				pub.ResourcesRevision++
				if err := Save(w, pub, s.now()); err != nil {
					return zero, err
				}
				if err := tx.UpdateWorkspace(ctx, w); err != nil {
					return zero, err
				}
			}
			// rec is COMPLETED already (the engine's default).
			return respond(pub), nil
		},
	})
}

// ResizeWritableLayer serves ResizeWorkspaceWritableLayer (seed 000, the
// timing of seed 003: it completes inside the request).
//
//   - capacity_bytes is absolute and required, a whole number of MiB of at
//     least limits.MinCapacityBytes: otherwise invalid_argument, nothing
//     recorded.
//   - Same state rule as UpdateWorkspaceMemory (failed_precondition,
//     STATE_CONFLICT, with observed_workspace); a resize still in flight on
//     the Workspace is failed_precondition (CONFLICT) too: the caller
//     resends that resize's command ID.
//   - Smaller than the current capacity: invalid_argument (recorded: it is
//     decided on the Workspace).
//   - Equal: plain success with the Workspace and no command. The command
//     ID is still recorded (kind 0), so that a resend replays the same
//     answer and the ID cannot be reused with another request, but
//     GetWorkspaceCommand does not know it (not_found), as for an
//     UpdateWorkspaceNetworkPolicy of equal content.
//   - Larger: the growth (target - current) must fit in what the
//     Workspace's placement can hold: the free bytes of its node's storage
//     pool (PoolFree), or, without that hook, without a placement, or when
//     the pool's capacity is unknown, the target must not exceed the
//     largest node's StorageBytes (when one is known). Otherwise
//     resource_exhausted (CAPACITY_EXHAUSTED, field capacity_bytes).
//   - A Workspace whose layer does not exist yet (writable_layer.exists
//     false) only records the capacity; the command completes at once and
//     the first start creates the layer at that size.
//   - Otherwise the command (RESIZE_WRITABLE_LAYER, initiator CALLER) is
//     opened: the capacity is recorded, a new generation is desired
//     STOPPED with it (the node grows the image and its filesystem offline
//     and reports the layer's capacity), and the call waits for the node up
//     to WaitBound (one minute). Past it: unavailable (TIMED_OUT,
//     retryable), the command goes on and GetWorkspaceCommand, or a resend
//     of the same command ID, answers later. How the reconciler completes
//     it, and what the Workspace records when the node fails, is in
//     internal/reconciler (resizeOutcome).
//
// The recorded acceptance of an opened resize carries the Workspace as the
// resize found it (its capacity before): the reconciler restores that
// capacity when the node fails the resize without reporting the layer's
// size. No caller sees the acceptance: every answer waits for completion.
func (s *Service) ResizeWritableLayer(ctx context.Context, req *ctrlv1.ResizeWorkspaceWritableLayerRequest) (*ctrlv1.ResizeWorkspaceWritableLayerResponse, error) {
	id := req.GetWorkspaceId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	if err := CheckLayerCapacity("capacity_bytes", req.GetCapacityBytes()); err != nil {
		return nil, err
	}
	out, err := command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.ResizeWorkspaceWritableLayerRequest, *ctrlv1.ResizeWorkspaceWritableLayerResponse]{
		Method: resizeMethod, ObjectKind: ObjectKind, ObjectID: id,
		CommandKind: int(ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_RESIZE_WRITABLE_LAYER), Request: req,
		NewResponse: func() *ctrlv1.ResizeWorkspaceWritableLayerResponse {
			return &ctrlv1.ResizeWorkspaceWritableLayerResponse{}
		},
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (*ctrlv1.ResizeWorkspaceWritableLayerResponse, error) {
			return s.decideResize(ctx, tx, rec, id, req.GetCapacityBytes())
		},
	})
	if err != nil {
		return nil, err
	}
	c := out.GetCommand()
	if c.GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_PROCESSING {
		return out, nil // equal capacity, or recorded for a layer that does not exist yet
	}
	// The reconciler pushes the new generation now, not at its next tick.
	s.kick()
	rec, err := s.wait(ctx, c.GetCommandId(), id)
	if err != nil {
		return nil, err
	}
	final := &ctrlv1.ResizeWorkspaceWritableLayerResponse{}
	if err := proto.Unmarshal(rec.Result, final); err != nil {
		return nil, fault.Internal("decode resize result: %v", err)
	}
	if final.GetCommand().GetStatus() != ctrlv1.WorkspaceCommandStatus_WORKSPACE_COMMAND_STATUS_COMPLETED {
		// Completed without a final response (not by the reconciler): the
		// Workspace as it is now is the answer.
		pub, err := s.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		final = &ctrlv1.ResizeWorkspaceWritableLayerResponse{Workspace: pub, Command: CommandMessage(rec)}
	}
	return final, nil
}

// decideResize is the admission of a resize, inside its transaction.
func (s *Service) decideResize(ctx context.Context, tx store.Tx, rec *store.Command, id string, target uint64) (*ctrlv1.ResizeWorkspaceWritableLayerResponse, error) {
	w, pub, err := s.load(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	if err := Admit(OpUpdateConfig, status(w, pub)); err != nil {
		return nil, observed(err, pub)
	}
	if w.CommandID != "" {
		fe := fault.Precondition(fault.ReasonConflict,
			"command %q is still in flight on this workspace: resend its command ID, or read it with GetWorkspaceCommand, before resizing again", w.CommandID)
		fe.Field = "workspace_id"
		return nil, observed(fe, pub)
	}
	cur := pub.GetWritableLayer().GetCapacityBytes()
	switch {
	case target < cur:
		return nil, fault.Invalid("capacity_bytes", "capacity_bytes %d is smaller than the writable layer's %d: a layer only grows", target, cur)
	case target == cur:
		rec.Kind = 0 // no command opened: GetWorkspaceCommand does not list it
		return &ctrlv1.ResizeWorkspaceWritableLayerResponse{Workspace: pub}, nil
	}
	if err := s.checkGrowth(ctx, tx, w.NodeID, cur, target); err != nil {
		return nil, err
	}
	before := proto.CloneOf(pub)
	if pub.WritableLayer == nil {
		pub.WritableLayer = &ctrlv1.WritableLayer{}
	}
	pub.WritableLayer.CapacityBytes = target
	now := s.now()
	opened := pub.GetWritableLayer().GetExists()
	if opened {
		// The node grows the layer offline: a new generation desired
		// STOPPED (the Workspace holds no execution), which the node
		// answers once the layer has its new size.
		w.Power, w.ForceStop = store.PowerStopped, false
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
	if opened {
		return &ctrlv1.ResizeWorkspaceWritableLayerResponse{Workspace: before, Command: acceptance(rec)}, nil
	}
	// rec is COMPLETED already (the engine's default).
	return &ctrlv1.ResizeWorkspaceWritableLayerResponse{Workspace: pub, Command: CommandMessage(rec)}, nil
}

// checkGrowth refuses a growth of the layer from cur to target bytes that
// the placement cannot hold (resource_exhausted, CAPACITY_EXHAUSTED).
func (s *Service) checkGrowth(ctx context.Context, tx store.Tx, nodeID string, cur, target uint64) error {
	exhausted := func(format string, args ...any) error {
		return &fault.Error{Kind: fault.KindResourceExhausted, Reason: fault.ReasonCapacityExhausted, Field: "capacity_bytes",
			Stage: "admission", Message: fmt.Sprintf(format, args...)}
	}
	if s.PoolFree != nil && nodeID != "" {
		free, known, err := s.PoolFree(ctx, tx, nodeID)
		if err != nil {
			return err
		}
		if known {
			if growth := target - cur; growth > free {
				return exhausted("growing the writable layer by %d bytes to %d needs more than the %d bytes free in the storage pool of node %q",
					growth, target, free, nodeID)
			}
			return nil
		}
	}
	if s.MaxCapacity == nil {
		return nil
	}
	if largest := s.MaxCapacity().StorageBytes; largest > 0 && target > largest {
		return exhausted("capacity_bytes %d exceeds the storage of every node (%d bytes at most)", target, largest)
	}
	return nil
}
