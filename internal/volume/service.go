package volume

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/caller"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/ids"
	"github.com/kibotos/kibotos/internal/labels"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/store"
)

// The procedures of the commands the Service records. A procedure is part
// of each command's fingerprint, so these never change; a test pins them to
// the generated handler's.
const (
	createMethod      = "/kibotos.ctrl.v1.VolumeService/CreateVolume"
	resizeMethod      = "/kibotos.ctrl.v1.VolumeService/ResizeVolume"
	deleteMethod      = "/kibotos.ctrl.v1.VolumeService/DeleteVolume"
	labelsMethod      = "/kibotos.ctrl.v1.VolumeService/UpdateVolumeLabels"
	annotationsMethod = "/kibotos.ctrl.v1.VolumeService/UpdateVolumeAnnotations"
)

// Service serves VolumeService. Admission records the desired state and
// the command; the reconciler drives the node and completes the command
// (Report); create, resize and delete wait for that up to WaitBound.
type Service struct {
	Engine *command.Engine
	Store  store.Store
	Pages  *paging.Codec
	Now    func() time.Time
	// Connected returns the IDs of the connected nodes that serve Volumes
	// (their Hello lists nodewire.FeatureVolumes): where the server may
	// place a Volume the caller did not place.
	Connected func() []string
	// Kick wakes the reconciler after an admission.
	Kick func()
	// WaitBound bounds how long create, resize and delete wait for the
	// node (one minute by default).
	WaitBound time.Duration
	// Recheck is how often a wait re-reads the store without a
	// notification (store.RecheckInterval by default).
	Recheck time.Duration
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC().Truncate(time.Microsecond)
	}
	return time.Now().UTC().Truncate(time.Microsecond)
}

func (s *Service) kick() {
	if s.Kick != nil {
		s.Kick()
	}
}

func (s *Service) bound() time.Duration {
	if s.WaitBound > 0 {
		return s.WaitBound
	}
	return time.Minute
}

func (s *Service) recheck() time.Duration {
	if s.Recheck > 0 {
		return s.Recheck
	}
	return store.RecheckInterval
}

func validateID(id string) error { return ids.Validate("volume_id", IDPrefix, "volume", id) }

// CheckCapacity validates a Volume capacity a request gives in field: a
// whole number of MiB from MinCapacityBytes to MaxCapacityBytes.
func CheckCapacity(field string, b uint64) error {
	switch {
	case b == 0:
		return fault.Invalid(field, "%s is required", field)
	case b%MiB != 0:
		return fault.Invalid(field, "capacity %d is not a whole number of MiB", b)
	case b < MinCapacityBytes:
		return fault.Invalid(field, "a volume is at least %d MiB", MinCapacityBytes/MiB)
	case b > MaxCapacityBytes:
		return fault.Invalid(field, "a volume is at most %d MiB", MaxCapacityBytes/MiB)
	}
	return nil
}

// CommandMessage is the public form of a Volume command record.
func CommandMessage(rec *store.Command) *ctrlv1.VolumeCommand {
	c := &ctrlv1.VolumeCommand{
		CommandId: rec.ID, VolumeId: rec.ObjectID, Kind: ctrlv1.VolumeCommandKind(rec.Kind),
		Status: ctrlv1.VolumeCommandStatus(rec.Status), CreatedAt: timestamppb.New(rec.CreatedAt),
		Caller: nodewire.Cut(rec.Caller, caller.MaxSubject),
	}
	if !rec.CompletedAt.IsZero() {
		c.CompletedAt = timestamppb.New(rec.CompletedAt)
	}
	if rec.ErrorCode != "" {
		d := &ctrlv1.ErrorDetail{}
		_ = proto.Unmarshal(rec.ErrorDetail, d)
		c.Error = &ctrlv1.CommandError{Code: rec.ErrorCode, Detail: d}
	}
	return c
}

func acceptance(rec *store.Command) *ctrlv1.VolumeCommand {
	c := *rec
	c.Status, c.CompletedAt = store.CommandProcessing, time.Time{}
	return CommandMessage(&c)
}

// result is the shape CreateVolumeResponse, ResizeVolumeResponse and
// DeleteVolumeResponse share (volume = 1, command = 2): what the recorded
// result of each is decoded into.
type result = ctrlv1.CreateVolumeResponse

// Create serves CreateVolume: the Volume is CREATING on its node with a
// command that the node's report completes; the call waits for it.
func (s *Service) Create(ctx context.Context, req *ctrlv1.CreateVolumeRequest) (*ctrlv1.CreateVolumeResponse, error) {
	capacity := req.GetCapacityBytes()
	if err := CheckCapacity("capacity_bytes", capacity); err != nil {
		return nil, err
	}
	if err := labels.ValidateLabels("labels", req.GetLabels()); err != nil {
		return nil, err
	}
	if err := labels.ValidateAnnotations("annotations", req.GetAnnotations()); err != nil {
		return nil, err
	}
	var connected []string
	if req.GetPlacement().GetNodeId() == "" && s.Connected != nil {
		connected = s.Connected()
	}
	out, err := command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.CreateVolumeRequest, *result]{
		Method: createMethod, ObjectKind: ObjectKind, CommandKind: int(ctrlv1.VolumeCommandKind_VOLUME_COMMAND_KIND_CREATE),
		Request: req, NewResponse: func() *result { return &result{} },
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (*result, error) {
			node, pool, err := place(ctx, tx, req.GetPlacement(), capacity, connected)
			if err != nil {
				return nil, err
			}
			now := s.now()
			id := ids.New(IDPrefix)
			v := &Volume{
				Res: &store.Resource{Kind: KindVolume, ID: id, CreatedAt: now, Revision: 1},
				Pub: &ctrlv1.Volume{VolumeId: id, State: ctrlv1.VolumeState_VOLUME_STATE_CREATING, CapacityBytes: capacity,
					Placement: &ctrlv1.Placement{NodeId: node, StoragePool: pool},
					Labels:    nonNil(req.GetLabels()), LabelsRevision: 1, Annotations: nonNil(req.GetAnnotations()), AnnotationsRevision: 1,
					CreatedAt: timestamppb.New(now)},
				Node: node, Generation: 1, Capacity: capacity, Command: rec.ID,
			}
			if err := v.encode(now); err != nil {
				return nil, err
			}
			if err := tx.InsertResource(ctx, v.Res); err != nil {
				return nil, err
			}
			rec.ObjectID, rec.Status = id, store.CommandProcessing
			return &result{Volume: v.Pub, Command: acceptance(rec)}, nil
		},
	})
	s.kick()
	if err != nil {
		return nil, err
	}
	return s.finish(ctx, out)
}

// place decides where a new Volume of capacity goes: the caller's node
// (known, serving Volumes, its pool the one named if one is, with room), or
// the connected node serving Volumes whose pool has the most room (and the
// name asked for, if any; ties go to the smallest node ID).
func place(ctx context.Context, tx store.Tx, pl *ctrlv1.Placement, capacity uint64, connected []string) (node, pool string, err error) {
	if id := pl.GetNodeId(); id != "" {
		n, err := tx.GetNode(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return "", "", fault.Invalid("placement.node_id", "no node %q is known", ids.Truncate(id))
		}
		if err != nil {
			return "", "", err
		}
		hello := nodeHello(n)
		if !slices.Contains(hello.GetFeatures(), nodewire.FeatureVolumes) {
			fe := fault.Precondition(fault.ReasonStateConflict, "node %q does not serve volumes", id)
			fe.Field = "placement.node_id"
			return "", "", fe
		}
		pool = hello.GetCapacity().GetStoragePool()
		if want := pl.GetStoragePool(); want != "" && want != pool {
			return "", "", fault.Invalid("placement.storage_pool", "node %q has storage pool %q, not %q", id, pool, ids.Truncate(want))
		}
		if st, err := nodeState(ctx, tx, id); err != nil {
			return "", "", err
		} else if !st.Placeable() {
			fe := fault.Precondition(fault.ReasonStateConflict, "node %q is %s: no new volume is placed on it", id, strings.ToLower(string(st)))
			fe.Field = "placement.node_id"
			return "", "", fe
		}
		free, known, err := PoolFree(ctx, tx, id)
		if err != nil {
			return "", "", err
		}
		if known && free < capacity {
			return "", "", exhausted("placement", "the storage pool of node %q has %d MiB free, the volume needs %d MiB", id, free/MiB, capacity/MiB)
		}
		return id, pool, nil
	}
	if len(connected) == 0 {
		fe := fault.Unavailable(fault.ReasonNodeUnreachable, "no connected node serves volumes; nothing was recorded, retry later")
		fe.Stage = "placement"
		return "", "", fe
	}
	use, err := PoolUsage(ctx, tx)
	if err != nil {
		return "", "", err
	}
	var best string
	var bestFree uint64
	named := 0
	var inactive []string // named nodes that are not ACTIVE: "node "a" is draining"
	for _, id := range slices.Sorted(slices.Values(connected)) {
		n, err := tx.GetNode(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return "", "", err
		}
		hello := nodeHello(n)
		if !slices.Contains(hello.GetFeatures(), nodewire.FeatureVolumes) {
			continue
		}
		p := hello.GetCapacity().GetStoragePool()
		if want := pl.GetStoragePool(); want != "" && want != p {
			continue
		}
		named++
		if st, err := nodeState(ctx, tx, id); err != nil {
			return "", "", err
		} else if !st.Placeable() {
			inactive = append(inactive, fmt.Sprintf("node %q is %s", id, strings.ToLower(string(st))))
			continue
		}
		free, known, err := freeOf(ctx, tx, n, use)
		if err != nil {
			return "", "", err
		}
		if known && free < capacity {
			continue
		}
		if !known {
			free = 0 // a node that reports no pool size comes last
		}
		if best == "" || free > bestFree {
			best, bestFree, pool = id, free, p
		}
	}
	switch {
	case named == 0:
		return "", "", fault.Invalid("placement.storage_pool", "no connected node serving volumes has storage pool %q", ids.Truncate(pl.GetStoragePool()))
	case len(inactive) == named:
		return "", "", fault.Precondition(fault.ReasonStateConflict, "no connected node serving volumes is ACTIVE, and no new volume is placed on the others: %s",
			strings.Join(inactive, ", "))
	case best == "":
		return "", "", exhausted("placement", "no connected node serving volumes has %d MiB free in its storage pool", capacity/MiB)
	}
	return best, pool, nil
}

func exhausted(stage, format string, args ...any) *fault.Error {
	fe := fault.Precondition(fault.ReasonCapacityExhausted, format, args...)
	fe.Kind, fe.Stage = fault.KindResourceExhausted, stage
	return fe
}

// nodeState is a node's fleet state (ACTIVE when it has no record).
func nodeState(ctx context.Context, tx store.Tx, id string) (fleet.State, error) {
	_, rec, err := fleet.GetRecord(ctx, tx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fleet.StateActive, nil
	case err != nil:
		return "", err
	}
	if rec.State == "" {
		return fleet.StateActive, nil
	}
	return rec.State, nil
}

// nodeHello is the Hello a node row records (its capacity, pool and
// features); empty when it does not decode.
func nodeHello(n *store.Node) *nodev1.Hello {
	h := &nodev1.Hello{}
	if proto.Unmarshal(n.Doc, h) != nil {
		return &nodev1.Hello{}
	}
	return h
}

// finish completes a create, resize or delete: a command still PROCESSING
// is waited for (wait); a completed one, or none (a resize to the current
// capacity), is the answer as it is.
func (s *Service) finish(ctx context.Context, out *result) (*result, error) {
	c := out.GetCommand()
	if c.GetStatus() != ctrlv1.VolumeCommandStatus_VOLUME_COMMAND_STATUS_PROCESSING {
		return out, nil
	}
	rec, err := s.wait(ctx, c.GetCommandId(), c.GetVolumeId())
	if err != nil {
		return nil, err
	}
	final := &result{}
	if proto.Unmarshal(rec.Result, final) == nil &&
		final.GetCommand().GetStatus() == ctrlv1.VolumeCommandStatus_VOLUME_COMMAND_STATUS_COMPLETED {
		return final, nil
	}
	v, err := s.Get(ctx, c.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return &result{Volume: v, Command: CommandMessage(rec)}, nil
}

// wait blocks until the command completes or the bound passes (see
// command.Awaiter.Wait): the Volume's topic wakes it.
func (s *Service) wait(ctx context.Context, id, volumeID string) (*store.Command, error) {
	a := command.Awaiter{Store: s.Store, Read: s.readCommand, Topic: Topic, Recheck: s.recheck(), Retrieve: "GetVolumeCommand"}
	return a.Wait(ctx, id, volumeID, s.bound())
}

// readCommand reads a Volume command; not_found for an unknown ID, a
// command of another kind of object, or one that opened no command (a
// label update, a resize to the current capacity).
func (s *Service) readCommand(ctx context.Context, id string) (*store.Command, error) {
	var rec *store.Command
	err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		rec, err = tx.GetCommand(ctx, id)
		return err
	})
	if errors.Is(err, store.ErrNotFound) || (err == nil && (rec.ObjectKind != ObjectKind || rec.Kind == 0)) {
		return nil, fault.NotFound("volume command", ids.Truncate(id))
	}
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// GetCommand serves GetVolumeCommand. The ID is not checked against the
// command ID rules.
func (s *Service) GetCommand(ctx context.Context, id string) (*ctrlv1.VolumeCommand, error) {
	if id == "" {
		return nil, fault.Invalid("command_id", "command_id is required")
	}
	rec, err := s.readCommand(ctx, id)
	if err != nil {
		return nil, err
	}
	return CommandMessage(rec), nil
}

// Get reads a Volume, deleted ones included.
func (s *Service) Get(ctx context.Context, id string) (*ctrlv1.Volume, error) {
	if err := validateID(id); err != nil {
		return nil, err
	}
	var v *Volume
	err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		v, err = Load(ctx, tx, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return v.Pub, nil
}

// List serves ListVolumes: a page in creation order. Without
// include_deleted only live rows (KindVolume) are read; with it the page
// merges the live and the deleted rows, each read from the cursor on, so
// a page reads at most twice its size whatever the number of Volumes.
func (s *Service) List(ctx context.Context, req *ctrlv1.ListVolumesRequest) (*ctrlv1.ListVolumesResponse, error) {
	n, err := paging.PageSize("page_size", req.GetPageSize())
	if err != nil {
		return nil, err
	}
	sel := req.GetLabelSelector()
	if err := labels.ValidateSelector("label_selector", sel); err != nil {
		return nil, err
	}
	filter := paging.Filter(labels.Canonical(sel), []byte(strconv.FormatBool(req.GetIncludeDeleted())))
	cur, ok, err := s.Pages.Decode(ObjectKind, filter, req.GetPageToken())
	if err != nil {
		return nil, err
	}
	kinds := []store.ResourceKind{KindVolume}
	if req.GetIncludeDeleted() {
		kinds = append(kinds, KindDeleted)
	}
	var rows []*store.Resource
	err = s.Store.View(ctx, func(tx store.Tx) error {
		rows = nil
		for _, k := range kinds {
			q := store.ListQuery{Kind: k, Selector: sel, Limit: n + 1}
			if ok {
				q.After = &store.Cursor{CreatedAt: cur.CreatedAt, ID: cur.ID}
			}
			page, err := tx.ListResources(ctx, q)
			if err != nil {
				return err
			}
			rows = append(rows, page...)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(rows, func(a, b *store.Resource) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	out := &ctrlv1.ListVolumesResponse{}
	if len(rows) > n {
		rows = rows[:n]
		last := rows[n-1]
		out.NextPageToken = s.Pages.Encode(ObjectKind, filter, paging.Cursor{CreatedAt: last.CreatedAt, ID: last.ID})
	}
	for _, r := range rows {
		v, err := Decode(r)
		if err != nil {
			return nil, err
		}
		out.Volumes = append(out.Volumes, v.Pub)
	}
	return out, nil
}

// Resize serves ResizeVolume: an absolute, upward, whole-MiB target. Equal
// to the current capacity it succeeds with no command; smaller is
// invalid_argument; beyond what the node's pool holds is
// resource_exhausted. Only an AVAILABLE Volume with no command in flight
// is resized; the public capacity changes when the node confirms.
func (s *Service) Resize(ctx context.Context, req *ctrlv1.ResizeVolumeRequest) (*ctrlv1.ResizeVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetCapacityBytes()
	if err := validateID(id); err != nil {
		return nil, err
	}
	if err := CheckCapacity("capacity_bytes", target); err != nil {
		return nil, err
	}
	out, err := command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.ResizeVolumeRequest, *result]{
		Method: resizeMethod, ObjectKind: ObjectKind, ObjectID: id, CommandKind: int(ctrlv1.VolumeCommandKind_VOLUME_COMMAND_KIND_RESIZE),
		Request: req, NewResponse: func() *result { return &result{} },
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (*result, error) {
			v, err := Load(ctx, tx, id)
			if err != nil {
				return nil, err
			}
			if st := v.Pub.GetState(); st != ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE {
				return nil, Observed(fault.Precondition(fault.ReasonStateConflict, "a resize is not accepted by a volume in state %s", shortState(st)), v.Pub)
			}
			cur := v.Pub.GetCapacityBytes()
			switch {
			case target < cur:
				return nil, fault.Invalid("capacity_bytes", "a volume only grows: %d MiB is smaller than its capacity of %d MiB", target/MiB, cur/MiB)
			case target == cur:
				rec.Kind = 0 // no command opened: GetVolumeCommand does not know it
				return &result{Volume: v.Pub}, nil
			case v.Command != "":
				return nil, Observed(fault.Precondition(fault.ReasonConflict, "command %q is still in flight on this volume", v.Command), v.Pub)
			}
			free, known, err := PoolFree(ctx, tx, v.Node)
			if err != nil {
				return nil, err
			}
			if known && free+v.Capacity < target {
				return nil, exhausted("admission", "the storage pool of node %q has %d MiB free, growing the volume to %d MiB needs %d MiB more",
					v.Node, free/MiB, target/MiB, (target-v.Capacity)/MiB)
			}
			now := s.now()
			v.Capacity, v.Command = target, rec.ID
			v.Generation++
			if err := v.save(ctx, tx, now); err != nil {
				return nil, err
			}
			rec.Status = store.CommandProcessing
			return &result{Volume: v.Pub, Command: acceptance(rec)}, nil
		},
	})
	s.kick()
	if err != nil {
		return nil, err
	}
	res, err := s.finish(ctx, out)
	if err != nil {
		return nil, err
	}
	return &ctrlv1.ResizeVolumeResponse{Volume: res.GetVolume(), Command: res.GetCommand()}, nil
}

// Delete serves DeleteVolume: refused while the Volume is bound
// (failed_precondition, CONFLICT) and once its deletion began; a create or
// resize still waiting for the node is superseded. The Volume is DELETING
// until the node removed the image, then DELETED.
func (s *Service) Delete(ctx context.Context, req *ctrlv1.DeleteVolumeRequest) (*ctrlv1.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	out, err := command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.DeleteVolumeRequest, *result]{
		Method: deleteMethod, ObjectKind: ObjectKind, ObjectID: id, CommandKind: int(ctrlv1.VolumeCommandKind_VOLUME_COMMAND_KIND_DELETE),
		Request: req, NewResponse: func() *result { return &result{} },
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (*result, error) {
			v, err := Load(ctx, tx, id)
			if err != nil {
				return nil, err
			}
			switch st := v.Pub.GetState(); {
			case st == ctrlv1.VolumeState_VOLUME_STATE_DELETING || st == ctrlv1.VolumeState_VOLUME_STATE_DELETED:
				return nil, Observed(fault.Precondition(fault.ReasonStateConflict, "a delete is not accepted by a volume in state %s", shortState(st)), v.Pub)
			case v.Pub.GetBoundWorkspaceId() != "":
				return nil, Observed(fault.Precondition(fault.ReasonConflict, "the volume is bound to workspace %q: release it first (UpdateWorkspaceVolumeBinding)",
					v.Pub.GetBoundWorkspaceId()), v.Pub)
			}
			now := s.now()
			if err := supersede(ctx, tx, v, "superseded by command "+strconv.Quote(rec.ID), now); err != nil {
				return nil, err
			}
			v.Deleted, v.Command = true, rec.ID
			v.Generation++
			v.Pub.State = ctrlv1.VolumeState_VOLUME_STATE_DELETING
			if err := v.save(ctx, tx, now); err != nil {
				return nil, err
			}
			rec.Status = store.CommandProcessing
			return &result{Volume: v.Pub, Command: acceptance(rec)}, nil
		},
	})
	s.kick()
	// The admission may have superseded a command: wake its waiters.
	s.Store.Notify(Topic(id))
	if err != nil {
		return nil, err
	}
	res, err := s.finish(ctx, out)
	if err != nil {
		return nil, err
	}
	return &ctrlv1.DeleteVolumeResponse{Volume: res.GetVolume(), Command: res.GetCommand()}, nil
}

// supersede completes the command waiting on v, which a newer change
// replaces (failed_precondition, CONFLICT, stage "superseded", why the
// message); its waiters see it at their next read.
func supersede(ctx context.Context, tx store.Tx, v *Volume, why string, now time.Time) error {
	if v.Command == "" {
		return nil
	}
	old, err := tx.GetCommand(ctx, v.Command)
	v.Command = ""
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil || old.Status == store.CommandCompleted {
		return err
	}
	fe := fault.Precondition(fault.ReasonConflict, "%s", why)
	fe.Stage = "superseded"
	if old.ErrorCode, old.ErrorDetail, err = fault.Encode(fe); err != nil {
		return err
	}
	old.Status, old.CompletedAt = store.CommandCompleted, now
	return tx.UpdateCommand(ctx, old)
}

// UpdateMap serves UpdateVolumeLabels (annotations false) and
// UpdateVolumeAnnotations: the whole map is replaced under CAS on its own
// revision (aborted on a mismatch); equal content keeps the revision; a
// DELETED Volume refuses (failed_precondition).
func (s *Service) UpdateMap(ctx context.Context, req command.Input, id string, annotations bool, expected uint64, m map[string]string) (*ctrlv1.Volume, error) {
	if err := validateID(id); err != nil {
		return nil, err
	}
	method, field, validate := labelsMethod, "labels", labels.ValidateLabels
	if annotations {
		method, field, validate = annotationsMethod, "annotations", labels.ValidateAnnotations
	}
	if err := validate(field, m); err != nil {
		return nil, err
	}
	out, err := command.Execute(ctx, s.Engine, command.Spec[command.Input, *ctrlv1.GetVolumeResponse]{
		Method: method, ObjectKind: ObjectKind, ObjectID: id, Request: req,
		NewResponse: func() *ctrlv1.GetVolumeResponse { return &ctrlv1.GetVolumeResponse{} },
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (*ctrlv1.GetVolumeResponse, error) {
			v, err := Load(ctx, tx, id)
			if err != nil {
				return nil, err
			}
			if v.Pub.GetState() == ctrlv1.VolumeState_VOLUME_STATE_DELETED {
				return nil, Observed(fault.Precondition(fault.ReasonStateConflict, "the %s of a deleted volume cannot change", field), v.Pub)
			}
			cur, rev := &v.Pub.Labels, &v.Pub.LabelsRevision
			if annotations {
				cur, rev = &v.Pub.Annotations, &v.Pub.AnnotationsRevision
			}
			if *rev != expected {
				return nil, Observed(fault.RevisionMismatch("expected_revision", expected, *rev), v.Pub)
			}
			if !maps.Equal(*cur, m) {
				*cur = nonNil(m)
				*rev++
				if err := v.save(ctx, tx, s.now()); err != nil {
					return nil, err
				}
			}
			return &ctrlv1.GetVolumeResponse{Volume: v.Pub}, nil
		},
	})
	if err != nil {
		return nil, err
	}
	return out.GetVolume(), nil
}
