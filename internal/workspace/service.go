package workspace

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/caller"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/ids"
	"github.com/kibotos/kibotos/internal/labels"
	"github.com/kibotos/kibotos/internal/netpolicy"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace/limits"
)

// ObjectKind names Workspaces in command records.
const ObjectKind = "workspace"

// idPrefix starts every Workspace ID.
const idPrefix = "ws-"

// The procedures of the commands the Service names itself (UpdateMap is
// given its own). A procedure is part of each command's fingerprint, so
// these never change; a test pins them to the generated handler's.
const (
	createMethod = "/kibotos.ctrl.v1.WorkspaceService/CreateWorkspace"
	startMethod  = "/kibotos.ctrl.v1.WorkspaceService/StartWorkspace"
	stopMethod   = "/kibotos.ctrl.v1.WorkspaceService/StopWorkspace"
	deleteMethod = "/kibotos.ctrl.v1.WorkspaceService/DeleteWorkspace"
	revokeMethod = "/kibotos.ctrl.v1.WorkspaceService/RevokeWorkspaceDataPlane"
)

// Capacity is the largest a single node offers; zero when no node is known.
type Capacity struct {
	MemoryMiB    uint64
	CPUMillis    uint64
	StorageBytes uint64
}

// Service admits Workspace commands. Running them is the reconciler's job:
// admission only records the desired state and the command.
type Service struct {
	Engine *command.Engine
	Store  store.Store
	Pages  *paging.Codec
	Now    func() time.Time
	// Templates resolves a template ID to its version; false when unknown.
	// It serves when ResolveTemplate is nil (no published Templates).
	Templates func(id string) (version string, ok bool)
	// ResolveTemplate, when set, resolves the template_id and
	// template_version of a CreateWorkspace inside tx to the version the
	// Workspace records (internal/artifact.ResolveTemplate: published
	// Templates, and those the nodes build through Templates); its refusals
	// are faults.
	ResolveTemplate func(ctx context.Context, tx store.Tx, templateID, version string) (string, error)
	// MaxCapacity is the capacity of the largest node.
	MaxCapacity func() Capacity
	// Kick wakes the reconciler after an admission.
	Kick func()
	// Admitted, when set, is called with the Workspace of each admission,
	// after its commit: this replica's reconciler places it when it has no
	// node yet (reconciler.Reconciler.Admitted). A create calls only
	// Admitted; other commands call Kick too.
	Admitted func(id string)
	// WaitBound bounds how long stop and delete wait (one minute by default).
	WaitBound time.Duration
	// Recheck is how often a wait re-reads the store without a notification
	// (store.RecheckInterval by default).
	Recheck time.Duration
	// PoolFree returns, inside tx, the bytes still free in the storage pool
	// of node nodeID (writable layers counted at their capacity, and
	// Volumes); known is false when the pool's capacity is not known.
	// ResizeWorkspaceWritableLayer refuses a growth beyond it. Nil: the
	// growth is checked against the largest node's StorageBytes only.
	PoolFree func(ctx context.Context, tx store.Tx, nodeID string) (free uint64, known bool, err error)
}

// The bounds of GetWorkspaceCommand's wait_timeout.
const (
	MinWaitTimeout = time.Millisecond
	MaxWaitTimeout = time.Minute
)

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

func (s *Service) admitted(id string) {
	if s.Admitted != nil {
		s.Admitted(id)
	}
}

// Decode returns the public Workspace of a row.
func Decode(w *store.Workspace) (*ctrlv1.Workspace, error) {
	pub := &ctrlv1.Workspace{}
	if err := proto.Unmarshal(w.Doc, pub); err != nil {
		return nil, fault.Internal("decode workspace: %v", err)
	}
	return pub, nil
}

// Save writes pub into the row's document and query columns.
func Save(w *store.Workspace, pub *ctrlv1.Workspace, now time.Time) error {
	pub.UpdatedAt = timestamppb.New(now)
	w.UpdatedAt = now
	w.State = int32(pub.GetState())
	w.GuestCondition = int32(pub.GetGuestObservation().GetCondition())
	w.HoldsExecution = pub.GetHoldsExecution()
	w.Labels = pub.GetLabels()
	w.ExpirationDeadline = ArmedDeadline(pub)
	w.MemoryMiB = uint64(pub.GetResources().GetMemoryMib())
	w.LayerBytes = pub.GetWritableLayer().GetCapacityBytes()
	w.CPUMillis = uint64(pub.GetResources().GetCpuMillis())
	w.TemplateKey = store.TemplateKey(pub.GetTemplate().GetTemplateId(), pub.GetTemplate().GetVersion())
	if pub.GetDeletedAt() != nil {
		w.DeletedAt = pub.GetDeletedAt().AsTime()
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(pub)
	if err != nil {
		return fault.Internal("encode workspace: %v", err)
	}
	w.Doc = b
	return nil
}

func (s *Service) load(ctx context.Context, tx store.Tx, id string) (*store.Workspace, *ctrlv1.Workspace, error) {
	w, err := tx.GetWorkspace(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, fault.NotFound("workspace", id)
	}
	if err != nil {
		return nil, nil, err
	}
	pub, err := Decode(w)
	return w, pub, err
}

func validateID(id string) error {
	if id == "" {
		return fault.Invalid("workspace_id", "workspace_id is required")
	}
	return nil
}

// CommandMessage builds the public form of a command record.
func CommandMessage(rec *store.Command) *ctrlv1.WorkspaceCommand {
	c := &ctrlv1.WorkspaceCommand{
		CommandId: rec.ID, WorkspaceId: rec.ObjectID,
		Kind:      ctrlv1.WorkspaceCommandKind(rec.Kind),
		Initiator: ctrlv1.CommandInitiator(rec.Initiator),
		Status:    ctrlv1.WorkspaceCommandStatus(rec.Status),
		CreatedAt: timestamppb.New(rec.CreatedAt),
	}
	if !rec.CompletedAt.IsZero() {
		c.CompletedAt = timestamppb.New(rec.CompletedAt)
	}
	// Why ctrl started it, bounded again whoever recorded it.
	c.Message = nodewire.Cut(rec.Message, store.MaxCommandMessage)
	c.Caller = nodewire.Cut(rec.Caller, caller.MaxSubject)
	if rec.ErrorCode != "" {
		d := &ctrlv1.ErrorDetail{}
		_ = proto.Unmarshal(rec.ErrorDetail, d)
		c.Error = &ctrlv1.CommandError{Code: rec.ErrorCode, Detail: d}
	}
	return c
}

// Create admits a creation command.
func (s *Service) Create(ctx context.Context, req *ctrlv1.CreateWorkspaceRequest) (*ctrlv1.CreateWorkspaceResponse, error) {
	now := s.now()
	res := req.GetResources()
	switch {
	case res == nil:
		return nil, fault.Invalid("resources", "resources are required")
	}
	// The bounds of UpdateWorkspaceMemory and UpdateWorkspaceCpu: a value
	// the node would refuse at start is refused here.
	if err := CheckMemory("resources.memory_mib", res.GetMemoryMib()); err != nil {
		return nil, err
	}
	if err := CheckCPU("resources.cpu_millis", res.GetCpuMillis()); err != nil {
		return nil, err
	}
	capacity := req.GetWritableLayerCapacityBytes()
	if capacity == 0 {
		capacity = limits.DefaultCapacityBytes
	}
	if capacity%limits.MiB != 0 {
		return nil, fault.Invalid("writable_layer_capacity_bytes", "capacity %d is not a whole number of MiB", capacity)
	}
	if capacity < limits.MinCapacityBytes {
		return nil, fault.Invalid("writable_layer_capacity_bytes", "capacity must be at least %d MiB", limits.MinCapacityBytes/limits.MiB)
	}
	tmpl := req.GetTemplateId()
	if tmpl == "" {
		tmpl = DefaultTemplate
	}
	var version string
	if s.ResolveTemplate == nil {
		v, ok := s.Templates(tmpl)
		if !ok {
			return nil, fault.Invalid("template_id", "unknown template %q", tmpl)
		}
		if req.GetTemplateVersion() != "" {
			return nil, fault.Invalid("template_version", "this server publishes no Templates; template_version must be empty")
		}
		version = v
	}
	// Fields whose capability the deployment does not serve (volume binding,
	// a network policy beyond NONE, expiration) never reach here: the server
	// refuses them by capability.FieldNeeds before any handler runs.
	if err := netpolicy.Validate("network_policy", req.GetNetworkPolicy()); err != nil {
		return nil, err
	}
	if err := checkBinding("volume_binding", req.GetVolumeBinding(), true); err != nil {
		return nil, err
	}
	if err := labels.ValidateLabels("labels", req.GetLabels()); err != nil {
		return nil, err
	}
	if err := labels.ValidateAnnotations("annotations", req.GetAnnotations()); err != nil {
		return nil, err
	}
	normalize := func(r *ctrlv1.CreateWorkspaceRequest) { normalizePolicyInput(r.GetNetworkPolicy()) }
	if req.GetExpiration() != nil {
		defer s.Store.Notify(ExpirationTopic) // wakes the expiration engine
	}
	resp, err := command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.CreateWorkspaceRequest, *ctrlv1.CreateWorkspaceResponse]{
		Method: createMethod, ObjectKind: ObjectKind,
		CommandKind: int(ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_CREATE), Request: req, Normalize: normalize,
		NewResponse: func() *ctrlv1.CreateWorkspaceResponse { return &ctrlv1.CreateWorkspaceResponse{} },
		// Judged by the clock only when nothing is recorded: a resend
		// replays after the deadline passed.
		Prepare: func(ctx context.Context) error {
			if err := CheckExpirationSpec("expiration", req.GetExpiration(), s.now()); err != nil {
				return err
			}
			if s.ResolveTemplate == nil {
				return nil
			}
			// A template refused here records nothing; Decide resolves it
			// again in its transaction (a reclamation may come between).
			return s.Store.View(ctx, func(tx store.Tx) error {
				_, err := s.ResolveTemplate(ctx, tx, tmpl, req.GetTemplateVersion())
				return err
			})
		},
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (*ctrlv1.CreateWorkspaceResponse, error) {
			version := version
			if s.ResolveTemplate != nil {
				var err error
				if version, err = s.ResolveTemplate(ctx, tx, tmpl, req.GetTemplateVersion()); err != nil {
					return nil, err
				}
			}
			if c := s.MaxCapacity(); c.MemoryMiB > 0 && (uint64(res.GetMemoryMib()) > c.MemoryMiB || uint64(res.GetCpuMillis()) > c.CPUMillis ||
				(c.StorageBytes > 0 && capacity > c.StorageBytes)) {
				return nil, &fault.Error{Kind: fault.KindResourceExhausted, Reason: fault.ReasonCapacityExhausted, Field: "resources",
					Message: "the request exceeds the capacity of every node (" + strconv.FormatUint(c.MemoryMiB, 10) + " MiB, " + strconv.FormatUint(c.CPUMillis, 10) + " millicores at most)"}
			}
			policy := netpolicy.Normalize(req.GetNetworkPolicy())
			refs, err := checkReferences(ctx, tx, "network_policy", policy)
			if err != nil {
				return nil, err
			}
			policy.Revision = 1
			id := ids.New(idPrefix)
			exp := &ctrlv1.Expiration{Revision: 1}
			if e := req.GetExpiration(); e != nil && e.GetPolicy() != ctrlv1.ExpirationPolicy_EXPIRATION_POLICY_UNSPECIFIED {
				exp.Policy, exp.Deadline = e.GetPolicy(), e.GetDeadline()
			}
			pub := &ctrlv1.Workspace{
				WorkspaceId: id, State: ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING,
				Template:            &ctrlv1.TemplateRef{TemplateId: tmpl, Version: version},
				Resources:           &ctrlv1.Resources{MemoryMib: res.GetMemoryMib(), CpuMillis: res.GetCpuMillis()},
				ResourcesRevision:   1,
				WritableLayer:       &ctrlv1.WritableLayer{CapacityBytes: capacity},
				VolumeBinding:       &ctrlv1.VolumeBinding{Mode: ctrlv1.VolumeBindingMode_VOLUME_BINDING_MODE_NONE},
				BindingRevision:     1,
				NetworkPolicy:       policy,
				NetworkPolicyStatus: &ctrlv1.NetworkPolicyStatus{State: ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_PENDING},
				Expiration:          exp,
				DataPlaneGeneration: 1,
				Labels:              nonNil(req.GetLabels()), LabelsRevision: 1,
				Annotations: nonNil(req.GetAnnotations()), AnnotationsRevision: 1,
				CreatedAt: timestamppb.New(now),
			}
			if err := admitBinding(ctx, tx, pub, req.GetVolumeBinding()); err != nil {
				return nil, err
			}
			w := &store.Workspace{ID: id, CreatedAt: now, Power: store.PowerRunning, Generation: 1, CommandID: rec.ID}
			if err := Save(w, pub, now); err != nil {
				return nil, err
			}
			if err := tx.InsertWorkspace(ctx, w); err != nil {
				return nil, err
			}
			if len(refs) > 0 {
				if err := tx.SetReferences(ctx, id, refs); err != nil {
					return nil, err
				}
			}
			rec.ObjectID, rec.Status = id, store.CommandProcessing
			return &ctrlv1.CreateWorkspaceResponse{Workspace: pub, Command: acceptance(rec)}, nil
		},
	})
	switch {
	case err != nil:
	case s.Admitted != nil:
		s.Admitted(resp.GetWorkspace().GetWorkspaceId())
	default:
		s.kick()
	}
	return resp, err
}

func acceptance(rec *store.Command) *ctrlv1.WorkspaceCommand {
	c := *rec
	c.Status, c.CompletedAt = store.CommandProcessing, time.Time{}
	return CommandMessage(&c)
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return maps.Clone(m)
}

// Get reads a Workspace, deleted ones included.
func (s *Service) Get(ctx context.Context, id string) (*ctrlv1.Workspace, error) {
	if err := validateID(id); err != nil {
		return nil, err
	}
	var pub *ctrlv1.Workspace
	err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		_, pub, err = s.load(ctx, tx, id)
		return err
	})
	return pub, err
}

// List returns a page of Workspaces.
func (s *Service) List(ctx context.Context, req *ctrlv1.ListWorkspacesRequest) (*ctrlv1.ListWorkspacesResponse, error) {
	n, err := paging.PageSize("page_size", req.GetPageSize())
	if err != nil {
		return nil, err
	}
	states := make([]int32, 0, len(req.GetStates()))
	for i, st := range req.GetStates() {
		if st == ctrlv1.WorkspaceState_WORKSPACE_STATE_UNSPECIFIED {
			return nil, fault.Invalid("states", "states[%d] is unspecified", i)
		}
		if _, ok := ctrlv1.WorkspaceState_name[int32(st)]; !ok {
			return nil, fault.Invalid("states", "states[%d] = %d is not a known state", i, st)
		}
		if slices.Contains(states, int32(st)) {
			return nil, fault.Invalid("states", "states[%d] = %s is repeated", i, st)
		}
		states = append(states, int32(st))
	}
	if len(states) > 0 && req.GetIncludeDeleted() {
		return nil, fault.Invalid("include_deleted", "include_deleted and states are mutually exclusive")
	}
	gc := req.GetGuestCondition()
	if _, ok := ctrlv1.GuestCondition_name[int32(gc)]; !ok {
		return nil, fault.Invalid("guest_condition", "guest_condition %d is not a known condition", gc)
	}
	if err := labels.ValidateSelector("label_selector", req.GetLabelSelector()); err != nil {
		return nil, err
	}
	sorted := slices.Clone(states)
	slices.Sort(sorted)
	var stateBytes []byte
	for _, st := range sorted {
		stateBytes = strconv.AppendInt(stateBytes, int64(st), 10)
		stateBytes = append(stateBytes, ',')
	}
	filter := paging.Filter(labels.Canonical(req.GetLabelSelector()), stateBytes,
		[]byte(strconv.FormatBool(req.GetIncludeDeleted())), []byte(strconv.Itoa(int(gc))))
	cur, ok, err := s.Pages.Decode(ObjectKind, filter, req.GetPageToken())
	if err != nil {
		return nil, err
	}
	q := store.WorkspaceQuery{States: states, IncludeDeleted: req.GetIncludeDeleted(), GuestCondition: int32(gc),
		Selector: req.GetLabelSelector(), Limit: n + 1}
	if ok {
		q.After = &store.Cursor{CreatedAt: cur.CreatedAt, ID: cur.ID}
	}
	var rows []*store.Workspace
	if err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		rows, err = tx.ListWorkspaces(ctx, q)
		return err
	}); err != nil {
		return nil, err
	}
	out := &ctrlv1.ListWorkspacesResponse{}
	if len(rows) > n {
		rows = rows[:n]
		last := rows[n-1]
		out.NextPageToken = s.Pages.Encode(ObjectKind, filter, paging.Cursor{CreatedAt: last.CreatedAt, ID: last.ID})
	}
	for _, w := range rows {
		pub, err := Decode(w)
		if err != nil {
			return nil, err
		}
		out.Workspaces = append(out.Workspaces, pub)
	}
	return out, nil
}

// GetCommand reads a Workspace command by ID, caller's or ctrl's. With a
// wait_timeout it first waits until the command is COMPLETED or the timeout
// passes, and returns the command as it is then.
func (s *Service) GetCommand(ctx context.Context, req *ctrlv1.GetWorkspaceCommandRequest) (*ctrlv1.WorkspaceCommand, error) {
	id := req.GetCommandId()
	if id == "" {
		return nil, fault.Invalid("command_id", "command_id is required")
	}
	if req.GetWaitTimeout() == nil {
		rec, err := s.readCommand(ctx, id)
		if err != nil {
			return nil, err
		}
		return CommandMessage(rec), nil
	}
	d, err := CheckWaitTimeout("wait_timeout", req.GetWaitTimeout())
	if err != nil {
		return nil, err
	}
	rec, _, err := s.await(ctx, id, "", d)
	if err != nil {
		return nil, err
	}
	return CommandMessage(rec), nil
}

// CheckWaitTimeout validates a wait_timeout: a valid duration from
// MinWaitTimeout to MaxWaitTimeout.
func CheckWaitTimeout(field string, d *durationpb.Duration) (time.Duration, error) {
	if err := d.CheckValid(); err != nil {
		return 0, fault.Invalid(field, "%s is not a valid duration: %v", field, err)
	}
	v := d.AsDuration()
	if v < MinWaitTimeout || v > MaxWaitTimeout {
		return 0, fault.Invalid(field, "%s must be from %v to %v, not %v", field, MinWaitTimeout, MaxWaitTimeout, v)
	}
	return v, nil
}

// readCommand reads a Workspace command; not_found for an unknown ID or a
// command of another kind of object.
func (s *Service) readCommand(ctx context.Context, id string) (*store.Command, error) {
	var rec *store.Command
	err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		rec, err = tx.GetCommand(ctx, id)
		return err
	})
	if errors.Is(err, store.ErrNotFound) || (err == nil && (rec.ObjectKind != ObjectKind || rec.Kind == 0)) {
		return nil, fault.NotFound("workspace command", id)
	}
	if err != nil {
		return nil, err
	}
	return rec, nil
}

func (s *Service) recheck() time.Duration {
	if s.Recheck > 0 {
		return s.Recheck
	}
	return store.RecheckInterval
}

// awaiter waits for the commands of Workspaces: on the Workspace's topic,
// re-reading every Recheck.
func (s *Service) awaiter() command.Awaiter {
	return command.Awaiter{Store: s.Store, Read: s.readCommand, Topic: store.WorkspaceTopic, Recheck: s.recheck(),
		Retrieve: "GetWorkspaceCommand"}
}

// await waits until the command id is COMPLETED or d passes (see
// command.Awaiter.Await).
func (s *Service) await(ctx context.Context, id, workspaceID string, d time.Duration) (*store.Command, bool, error) {
	return s.awaiter().Await(ctx, id, workspaceID, d)
}

// transition is the common shape of start, stop and delete.
type transition struct {
	method   string
	kind     ctrlv1.WorkspaceCommandKind
	id       string
	expected uint64
	apply    func(tx store.Tx, w *store.Workspace, pub *ctrlv1.Workspace, now time.Time) error
	// ctrl marks a command ctrl starts itself: it acts on the Workspace
	// as it is, with no expected expiration revision.
	ctrl bool
	// prepare, when set, is the command's Prepare.
	prepare func(context.Context) error
}

func run[Req command.Input, Resp proto.Message](ctx context.Context, s *Service, req Req, t transition,
	respond func(*ctrlv1.Workspace, *ctrlv1.WorkspaceCommand) Resp, empty func() Resp) (Resp, error) {
	var zero Resp
	if err := validateID(t.id); err != nil {
		return zero, err
	}
	defer s.kick()
	defer s.admitted(t.id) // it may have no node: a start after a failed placement, a delete
	// The admission may have superseded (completed) the Workspace's
	// previous command: wake its waiters.
	defer s.Store.Notify(store.WorkspaceTopic(t.id))
	return command.Execute(ctx, s.Engine, command.Spec[Req, Resp]{
		Method: t.method, ObjectKind: ObjectKind, ObjectID: t.id, CommandKind: int(t.kind), Request: req, NewResponse: empty,
		Prepare: t.prepare,
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (Resp, error) {
			pub, err := s.admit(ctx, tx, rec, t)
			if err != nil {
				return zero, err
			}
			return respond(pub, acceptance(rec)), nil
		},
	})
}

// admit decides a start, stop or delete inside tx: the Workspace's state
// and expiration revision, the transition, the superseding of the command
// in flight, the bumped generation the node acts on. It sets rec.Status.
func (s *Service) admit(ctx context.Context, tx store.Tx, rec *store.Command, t transition) (*ctrlv1.Workspace, error) {
	w, pub, err := s.load(ctx, tx, t.id)
	if err != nil {
		return nil, err
	}
	if !t.ctrl {
		if err := CheckExpirationRevision(t.expected, pub.GetExpiration()); err != nil {
			return nil, observed(err, pub)
		}
	}
	now := s.now()
	if err := t.apply(tx, w, pub, now); err != nil {
		return nil, observed(err, pub)
	}
	// A command still waiting for the node is superseded.
	if w.CommandID != "" && w.CommandID != rec.ID {
		if err := Supersede(ctx, tx, w.CommandID, rec.ID, now); err != nil {
			return nil, err
		}
	}
	w.Generation++
	w.CommandID = rec.ID
	pub.Failure = nil
	if err := Save(w, pub, now); err != nil {
		return nil, err
	}
	if err := tx.UpdateWorkspace(ctx, w); err != nil {
		return nil, err
	}
	rec.Status = store.CommandProcessing
	return pub, nil
}

// AdmitCtrlStop admits inside tx a stop that ctrl starts itself under rec
// (its ID under a reserved prefix, kind STOP, its initiator; ObjectID the
// Workspace): a caller's StopWorkspace admission without an expected
// expiration revision and without a new expiration — the same state rules,
// the command in flight superseded, a STOP policy consumed — which the
// node then carries out like any stop (a normal one writes back first).
// force is STOP_MODE_FORCE. It sets rec.Status and returns the Workspace
// as admitted; the caller inserts rec, notifies the Workspace's topic and
// kicks the reconciler.
func (s *Service) AdmitCtrlStop(ctx context.Context, tx store.Tx, rec *store.Command, force bool) (*ctrlv1.Workspace, error) {
	t := stopTransition(rec.ObjectID, 0, force, nil)
	t.ctrl = true
	return s.admit(ctx, tx, rec, t)
}

// Supersede completes a command that a newer one replaced.
func Supersede(ctx context.Context, tx store.Tx, id, by string, now time.Time) error {
	old, err := tx.GetCommand(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil || old.Status == store.CommandCompleted {
		return err
	}
	fe := fault.Precondition(fault.ReasonConflict, "superseded by command %q", by)
	fe.Stage = "superseded"
	old.ErrorCode, old.ErrorDetail, err = fault.Encode(fe)
	if err != nil {
		return err
	}
	old.Status, old.CompletedAt = store.CommandCompleted, now
	return tx.UpdateCommand(ctx, old)
}

func status(w *store.Workspace, pub *ctrlv1.Workspace) Status {
	st := pub.GetState()
	if st == ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN {
		st = Underlying(w)
	}
	return Status{State: st, HoldsExecution: pub.GetHoldsExecution(),
		DeletionBegan: w.Power == store.PowerDeleted, ForcePending: w.ForceStop && w.Power == store.PowerStopped && w.CommandID != ""}
}

// Start admits a start command.
func (s *Service) Start(ctx context.Context, req *ctrlv1.StartWorkspaceRequest) (*ctrlv1.StartWorkspaceResponse, error) {
	return run(ctx, s, req, transition{
		method: startMethod, kind: ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_START,
		id: req.GetWorkspaceId(), expected: req.GetExpectedExpirationRevision(),
		apply: func(tx store.Tx, w *store.Workspace, pub *ctrlv1.Workspace, _ time.Time) error {
			if err := Admit(OpStart, status(w, pub)); err != nil {
				return err
			}
			if err := startableOnNode(ctx, tx, w.NodeID); err != nil {
				return err
			}
			w.Power, w.ForceStop = store.PowerRunning, false
			pub.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING
			return nil
		},
	}, func(pub *ctrlv1.Workspace, c *ctrlv1.WorkspaceCommand) *ctrlv1.StartWorkspaceResponse {
		return &ctrlv1.StartWorkspaceResponse{Workspace: pub, Command: c}
	}, func() *ctrlv1.StartWorkspaceResponse { return &ctrlv1.StartWorkspaceResponse{} })
}

// startableOnNode refuses, inside tx, a start on a node that is DRAINING
// with stop_workspaces (failed_precondition, STATE_CONFLICT): the drain's
// standing rule would stop the Workspace as soon as it is AVAILABLE. A
// Workspace not placed yet, or on a node without a record, starts.
func startableOnNode(ctx context.Context, tx store.Tx, nodeID string) error {
	if nodeID == "" {
		return nil
	}
	_, rec, err := fleet.GetRecord(ctx, tx, nodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return err
	case rec.State == fleet.StateDraining && rec.DrainStopsWorkspaces:
		return fault.Precondition(fault.ReasonStateConflict,
			"node %s is draining with stop_workspaces: its Workspaces are stopped, not started "+
				"(DrainNode without stop_workspaces or CancelNodeDrain lifts it)", nodeID)
	}
	return nil
}

// Stop admits a stop command and waits for it.
func (s *Service) Stop(ctx context.Context, req *ctrlv1.StopWorkspaceRequest) (*ctrlv1.StopWorkspaceResponse, error) {
	force := req.GetMode() == ctrlv1.StopMode_STOP_MODE_FORCE
	if _, ok := ctrlv1.StopMode_name[int32(req.GetMode())]; !ok {
		return nil, fault.Invalid("mode", "unknown stop mode %d", req.GetMode())
	}
	t := stopTransition(req.GetWorkspaceId(), req.GetExpectedExpirationRevision(), force, req.GetExpiration())
	if req.GetExpiration() != nil {
		// Judged by the clock only when nothing is recorded.
		t.prepare = func(context.Context) error { return CheckExpirationSpec("expiration", req.GetExpiration(), s.now()) }
	}
	_, err := run(ctx, s, req, t, func(pub *ctrlv1.Workspace, c *ctrlv1.WorkspaceCommand) *ctrlv1.StopWorkspaceResponse {
		return &ctrlv1.StopWorkspaceResponse{Workspace: pub, Command: c}
	}, func() *ctrlv1.StopWorkspaceResponse { return &ctrlv1.StopWorkspaceResponse{} })
	if err != nil {
		return nil, err
	}
	if req.GetExpiration() != nil {
		s.Store.Notify(ExpirationTopic) // wakes the expiration engine
	}
	rec, err := s.wait(ctx, req.GetMetadata().GetCommandId(), req.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	out := &ctrlv1.StopWorkspaceResponse{}
	return out, proto.Unmarshal(rec.Result, out)
}

// stopTransition is the stop of Workspace id, forced or not, committing
// exp (nil: a STOP policy is consumed, a DELETE policy stays).
func stopTransition(id string, expected uint64, force bool, exp *ctrlv1.ExpirationSpec) transition {
	return transition{
		method: stopMethod, kind: ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP, id: id, expected: expected,
		apply: func(_ store.Tx, w *store.Workspace, pub *ctrlv1.Workspace, _ time.Time) error {
			op := OpStop
			if force {
				op = OpForceStop
			}
			if err := Admit(op, status(w, pub)); err != nil {
				return err
			}
			w.Power, w.ForceStop = store.PowerStopped, force
			pub.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING
			pub.Expiration, _ = ExpirationAfterStop(pub.GetExpiration(), exp)
			return nil
		},
	}
}

// Delete admits a delete command and waits for it.
func (s *Service) Delete(ctx context.Context, req *ctrlv1.DeleteWorkspaceRequest) (*ctrlv1.DeleteWorkspaceResponse, error) {
	_, err := run(ctx, s, req, deleteTransition(req.GetWorkspaceId(), req.GetExpectedExpirationRevision()), func(pub *ctrlv1.Workspace, c *ctrlv1.WorkspaceCommand) *ctrlv1.DeleteWorkspaceResponse {
		return &ctrlv1.DeleteWorkspaceResponse{Workspace: pub, Command: c}
	}, func() *ctrlv1.DeleteWorkspaceResponse { return &ctrlv1.DeleteWorkspaceResponse{} })
	if err != nil {
		return nil, err
	}
	rec, err := s.wait(ctx, req.GetMetadata().GetCommandId(), req.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	out := &ctrlv1.DeleteWorkspaceResponse{}
	return out, proto.Unmarshal(rec.Result, out)
}

// deleteTransition is the delete of Workspace id.
func deleteTransition(id string, expected uint64) transition {
	return transition{
		method: deleteMethod, kind: ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_DELETE, id: id, expected: expected,
		apply: func(_ store.Tx, w *store.Workspace, pub *ctrlv1.Workspace, _ time.Time) error {
			if err := Admit(OpDelete, status(w, pub)); err != nil {
				return err
			}
			w.Power, w.ForceStop = store.PowerDeleted, true
			pub.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING
			return nil
		},
	}
}

// RevokeDataPlane serves RevokeWorkspaceDataPlane: one transaction raises
// data_plane_generation by one and records the command COMPLETED, so it
// returns completed (nothing runs asynchronously; the one-minute bound of
// the API is never reached). It has no expected revision. It neither
// supersedes the Workspace's command in flight nor wakes the reconciler:
// the execution is untouched. Its Workspace's topic is notified after the
// commit, which is what Verifiers on this replica invalidate their cached
// generation on.
func (s *Service) RevokeDataPlane(ctx context.Context, req *ctrlv1.RevokeWorkspaceDataPlaneRequest) (*ctrlv1.RevokeWorkspaceDataPlaneResponse, error) {
	id := req.GetWorkspaceId()
	if err := validateID(id); err != nil {
		return nil, err
	}
	defer s.Store.Notify(store.WorkspaceTopic(id))
	return command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.RevokeWorkspaceDataPlaneRequest, *ctrlv1.RevokeWorkspaceDataPlaneResponse]{
		Method: revokeMethod, ObjectKind: ObjectKind, ObjectID: id,
		CommandKind: int(ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_REVOKE_DATA_PLANE), Request: req,
		NewResponse: func() *ctrlv1.RevokeWorkspaceDataPlaneResponse { return &ctrlv1.RevokeWorkspaceDataPlaneResponse{} },
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (*ctrlv1.RevokeWorkspaceDataPlaneResponse, error) {
			w, pub, err := s.load(ctx, tx, id)
			if err != nil {
				return nil, err
			}
			if err := Admit(OpRevokeDataPlane, status(w, pub)); err != nil {
				return nil, observed(err, pub)
			}
			pub.DataPlaneGeneration++
			if err := Save(w, pub, s.now()); err != nil {
				return nil, err
			}
			if err := tx.UpdateWorkspace(ctx, w); err != nil {
				return nil, err
			}
			// rec is COMPLETED already (the engine's default).
			return &ctrlv1.RevokeWorkspaceDataPlaneResponse{Workspace: pub, Command: CommandMessage(rec)}, nil
		},
	})
}

// wait blocks until the command completes or the bound passes (see
// command.Awaiter.Wait).
func (s *Service) wait(ctx context.Context, id, workspaceID string) (*store.Command, error) {
	return s.awaiter().Wait(ctx, id, workspaceID, s.bound())
}

// UpdateMap replaces labels or annotations under CAS on their own revision.
func (s *Service) UpdateMap(ctx context.Context, method string, req command.Input, id string, annotations bool, expected uint64, m map[string]string) (*ctrlv1.Workspace, error) {
	if err := validateID(id); err != nil {
		return nil, err
	}
	field, validate, kind := "labels", labels.ValidateLabels, ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_LABELS
	if annotations {
		field, validate, kind = "annotations", labels.ValidateAnnotations, ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_UPDATE_ANNOTATIONS
	}
	if err := validate(field, m); err != nil {
		return nil, err
	}
	out, err := command.Execute(ctx, s.Engine, command.Spec[command.Input, *ctrlv1.GetWorkspaceResponse]{
		Method: method, ObjectKind: ObjectKind, ObjectID: id, CommandKind: int(kind), Request: req,
		NewResponse: func() *ctrlv1.GetWorkspaceResponse { return &ctrlv1.GetWorkspaceResponse{} },
		Decide: func(ctx context.Context, tx store.Tx, rec *store.Command) (*ctrlv1.GetWorkspaceResponse, error) {
			w, pub, err := s.load(ctx, tx, id)
			if err != nil {
				return nil, err
			}
			if err := Admit(OpUpdateMaps, status(w, pub)); err != nil {
				return nil, observed(err, pub)
			}
			cur, rev := &pub.Labels, &pub.LabelsRevision
			if annotations {
				cur, rev = &pub.Annotations, &pub.AnnotationsRevision
			}
			if *rev != expected {
				return nil, observed(fault.RevisionMismatch("expected_revision", expected, *rev), pub)
			}
			if !maps.Equal(*cur, m) {
				*cur = nonNil(m)
				*rev++
				if err := Save(w, pub, s.now()); err != nil {
					return nil, err
				}
				if err := tx.UpdateWorkspace(ctx, w); err != nil {
					return nil, err
				}
			}
			return &ctrlv1.GetWorkspaceResponse{Workspace: pub}, nil
		},
	})
	if err != nil {
		return nil, err
	}
	return out.GetWorkspace(), nil
}

// observed attaches the Workspace as it is to a refusal by its state
// (failed_precondition) or by one of its revisions (aborted, or
// failed_precondition for the expiration revision), so that the caller can
// tell the two apart and decide (seed 003). Other errors pass unchanged.
func observed(err error, pub *ctrlv1.Workspace) error {
	fe, ok := fault.As(err)
	if !ok || (fe.Kind != fault.KindFailedPrecondition && fe.Kind != fault.KindAborted) {
		return err
	}
	c := *fe
	c.ObservedWorkspace = proto.CloneOf(pub)
	return &c
}

// Underlying is the state a Workspace whose node fell silent had, from its
// desired and last observed state: admission judges commands on it, so a
// stop of a running Workspace is accepted while its node is away and
// completes when the node reports again.
func Underlying(w *store.Workspace) ctrlv1.WorkspaceState {
	settled := w.ObservedGeneration == w.Generation
	switch {
	case w.Power == store.PowerRunning && w.ObservedState == store.ExecRunning:
		// Settled, or a policy update the running execution has not
		// confirmed yet (a start never follows a running execution).
		return ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
	case w.Power == store.PowerRunning && settled && w.ObservedState == store.ExecFailed:
		return ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED
	case w.Power == store.PowerRunning && w.Generation <= 1:
		return ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING
	case w.Power == store.PowerRunning:
		return ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING
	case w.Power == store.PowerStopped && settled && w.ObservedState == store.ExecStopped:
		return ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED
	case w.Power == store.PowerStopped && settled:
		return ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED
	case w.Power == store.PowerStopped:
		return ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING
	case settled && w.ObservedState == store.ExecFailed:
		return ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED
	default:
		return ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING
	}
}
