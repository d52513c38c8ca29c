package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/command"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/ids"
	"github.com/kibotos/kibotos/internal/paging"
	"github.com/kibotos/kibotos/internal/store"
)

// ObjectKind names nodes (and the fleet's other records) in command
// records.
const ObjectKind = "node"

// Methods of NodeService's writes (part of the command fingerprint).
const (
	DrainMethod           = "kibotos.ctrl.v1.NodeService/DrainNode"
	CancelDrainMethod     = "kibotos.ctrl.v1.NodeService/CancelNodeDrain"
	IsolateMethod         = "kibotos.ctrl.v1.NodeService/IsolateNode"
	RetireMethod          = "kibotos.ctrl.v1.NodeService/RetireNode"
	SetOvercommitMethod   = "kibotos.ctrl.v1.NodeService/SetNodeOvercommit"
	SetDefaultsMethod     = "kibotos.ctrl.v1.NodeService/SetOvercommitDefaults"
	SetPoolCapacityMethod = "kibotos.ctrl.v1.NodeService/SetStoragePoolCapacity"
)

// MiB is a mebibyte: a pool's capacity is a whole number of them.
const MiB = 1 << 20

// maxNodeIDLen bounds a node ID a request names (a certificate's common
// name can be longer than an enrolled node's ID, but not absurdly so).
const maxNodeIDLen = 253

// listKind names ListNodes' page tokens.
const listKind = "node"

// VolumeUse is what the Volumes of a node whose deletion has not completed
// take: how many there are and the bytes they take of its pool.
type VolumeUse struct {
	Count int
	Bytes uint64
}

// Service serves NodeService (Operator API).
type Service struct {
	Engine *command.Engine
	Store  store.Store
	Pages  *paging.Codec
	Now    func() time.Time
	// Connected reports whether a node holds a stream to a ctrl replica; nil:
	// none does.
	Connected func(nodeID string) bool
	// StopWorkspaces stops, inside tx, the running Workspaces of a node
	// drained with stop_workspaces (their commands are started by the
	// drain's command drainCommandID). nil: DrainNode with stop_workspaces
	// is unimplemented (CAPABILITY_UNAVAILABLE).
	StopWorkspaces func(ctx context.Context, tx store.Tx, nodeID, drainCommandID string) error
	// EndKey runs after a RetireNode committed, once for each key it
	// denied: it ends the streams and tunnels that key holds.
	EndKey func(keyHash []byte)
	// EndDataPlane runs after an IsolateNode committed: it ends the
	// data-plane traffic this ctrl carries to the node.
	EndDataPlane func(nodeID string)
	// Changed runs after every committed write (the reconciler reloads its
	// View).
	Changed func()
	// Volumes returns, by node, what its Volumes take (internal/volume's
	// accounting, which this package does not import); nil: none.
	Volumes func(ctx context.Context, tx store.Tx) (map[string]VolumeUse, error)
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC().Truncate(time.Microsecond)
	}
	return time.Now().UTC().Truncate(time.Microsecond)
}

func (s *Service) changed() {
	if s.Changed != nil {
		s.Changed()
	}
}

func (s *Service) volumes(ctx context.Context, tx store.Tx) (map[string]VolumeUse, error) {
	if s.Volumes == nil {
		return map[string]VolumeUse{}, nil
	}
	return s.Volumes(ctx, tx)
}

// CheckNodeID checks the node ID a request names in field: required, at
// most 253 bytes of printable ASCII.
func CheckNodeID(field, id string) error {
	if id == "" {
		return fault.Invalid(field, "%s is required", field)
	}
	if len(id) > maxNodeIDLen {
		return fault.Invalid(field, "node ID %q is longer than %d bytes", ids.Truncate(id), maxNodeIDLen)
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] >= 0x7f {
			return fault.Invalid(field, "node ID %q has the byte %q at offset %d; only printable ASCII is allowed", ids.Truncate(id), id[i:i+1], i)
		}
	}
	return nil
}

// notFound is the answer for a node the store does not know.
func notFound(id string) error {
	fe := fault.NotFound("node", ids.Truncate(id))
	fe.Field = "node_id"
	return fe
}

// retiredRefusal is the refusal of a write to a RETIRED node.
func retiredRefusal(id string) error {
	return fault.Precondition(fault.ReasonStateConflict,
		"node %q is retired: its ID is a tombstone that takes no more writes", id)
}

// hello decodes the Hello a node row records; empty when it does not
// decode.
func hello(n *store.Node) *nodev1.Hello {
	h := &nodev1.Hello{}
	if n == nil || proto.Unmarshal(n.Doc, h) != nil {
		return &nodev1.Hello{}
	}
	return h
}

// loaded is a node as a write or a read finds it.
type loaded struct {
	node *store.Node // nil: only its record exists
	res  *store.Resource
	rec  *Record
}

// load reads node id and its record inside tx. A node registered before
// the fleet's records existed has none: it is shown as registration
// version 1, ACTIVE, and its record is created at its first write.
func (s *Service) load(ctx context.Context, tx store.Tx, id string) (*loaded, error) {
	n, err := tx.GetNode(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		n = nil
	case err != nil:
		return nil, err
	}
	r, rec, err := GetRecord(ctx, tx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		if n == nil {
			return nil, notFound(id)
		}
		r, rec = nil, implicitRecord(n)
	case err != nil:
		return nil, err
	}
	return &loaded{node: n, res: r, rec: rec}, nil
}

// implicitRecord is the record of a node registered before records
// existed.
func implicitRecord(n *store.Node) *Record {
	return &Record{RegistrationVersion: 1, State: StateActive, StateChangedAt: n.CreatedAt}
}

// defaults reads the overcommit defaults' row (nil when never set).
func defaults(ctx context.Context, tx store.Tx) (*store.Resource, Ratios, error) {
	r, err := tx.GetResource(ctx, KindDefaults, DefaultsID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, BuiltinDefaults, nil
	}
	if err != nil {
		return nil, Ratios{}, err
	}
	var d Ratios
	if err := json.Unmarshal(r.Spec, &d); err != nil {
		return nil, Ratios{}, fault.Internal("decode overcommit defaults: %v", err)
	}
	return r, d, nil
}

// pool reads a storage pool's row (nil when its capacity was never set).
func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// show assembles the API's Node of id inside tx.
func (s *Service) show(ctx context.Context, tx store.Tx, id string, l *loaded, d Ratios, vols map[string]VolumeUse) (*ctrlv1.Node, error) {
	n, rec := l.node, l.rec
	if n == nil {
		n = &store.Node{ID: id}
	}
	h := hello(n)
	u, err := tx.NodeUsage(ctx, id)
	if err != nil {
		return nil, err
	}
	on, err := tx.WorkspacesOnNode(ctx, id)
	if err != nil {
		return nil, err
	}
	v := &View{Nodes: map[string]*Record{id: rec}, Defaults: d}
	ratios, inherited := v.Ratios(id, h.GetCapacity().GetMemoryOvercommitRatio())
	out := &ctrlv1.Node{
		NodeId:               id,
		State:                rec.State.Proto(),
		RegistrationVersion:  rec.RegistrationVersion,
		Connected:            s.Connected != nil && s.Connected(id),
		LastSeenAt:           ts(n.LastSeen),
		CreatedAt:            ts(n.CreatedAt),
		Capacity:             &ctrlv1.NodeResources{MemoryMib: n.MemoryMiB, CpuMillis: n.CPUMillis},
		Allocated:            &ctrlv1.NodeResources{MemoryMib: u.RunningMemoryMiB, CpuMillis: u.RunningCPUMillis},
		Overcommit:           ratios.Proto(),
		OvercommitInherited:  inherited,
		Features:             slices.Clone(h.GetFeatures()),
		DrainStopsWorkspaces: rec.DrainStopsWorkspaces,
		StateChangedAt:       ts(rec.StateChangedAt),
		Workspaces:           uint32(len(on)),
		Volumes:              uint32(vols[id].Count),
	}
	if name := h.GetCapacity().GetStoragePool(); name != "" || n.StorageBytes > 0 {
		p, err := s.poolOf(ctx, tx, n, name, u.LayerBytes, vols[id].Bytes)
		if err != nil {
			return nil, err
		}
		out.StoragePools = []*ctrlv1.StoragePool{p}
	}
	for _, t := range h.GetTemplates() {
		if t.GetDigest() != "" { // published; one built on the node is not
			out.Templates = append(out.Templates, &ctrlv1.NodeArtifact{ArtifactId: t.GetTemplateId(), Version: t.GetVersion()})
		}
	}
	for _, p := range h.GetPlatforms() {
		out.Platforms = append(out.Platforms, &ctrlv1.NodeArtifact{ArtifactId: p.GetTemplateId(), Version: p.GetVersion()})
	}
	return out, nil
}

// poolOf assembles the API's StoragePool poolID of node n.
func (s *Service) poolOf(ctx context.Context, tx store.Tx, n *store.Node, poolID string, layers, volumes uint64) (*ctrlv1.StoragePool, error) {
	r, p, err := GetPool(ctx, tx, n.ID, poolID)
	if err != nil {
		return nil, err
	}
	out := &ctrlv1.StoragePool{NodeId: n.ID, PoolId: poolID, ReportedBytes: n.StorageBytes,
		OverrideBytes: p.OverrideBytes, UsedBytes: layers + volumes}
	if out.UsedBytes < layers { // overflow
		out.UsedBytes = ^uint64(0)
	}
	out.CapacityBytes = p.Capacity(n.StorageBytes)
	if r != nil {
		out.Version = r.Revision
	}
	return out, nil
}

// Get serves GetNode: any node, retired or not.
func (s *Service) Get(ctx context.Context, id string) (*ctrlv1.Node, error) {
	if err := CheckNodeID("node_id", id); err != nil {
		return nil, err
	}
	var out *ctrlv1.Node
	err := s.Store.View(ctx, func(tx store.Tx) error {
		l, err := s.load(ctx, tx, id)
		if err != nil {
			return err
		}
		_, d, err := defaults(ctx, tx)
		if err != nil {
			return err
		}
		vols, err := s.volumes(ctx, tx)
		if err != nil {
			return err
		}
		out, err = s.show(ctx, tx, id, l, d, vols)
		return err
	})
	return out, err
}

// List serves ListNodes: nodes in ID order, the retired ones only with
// include_retired. A node known only by its record (registered through an
// enrollment, never connected) is listed too.
func (s *Service) List(ctx context.Context, req *ctrlv1.ListNodesRequest) (*ctrlv1.ListNodesResponse, error) {
	size, err := paging.PageSize("page_size", req.GetPageSize())
	if err != nil {
		return nil, err
	}
	filter := paging.Filter([]byte(fmt.Sprint(req.GetIncludeRetired())))
	cur, after, err := s.Pages.Decode(listKind, filter, req.GetPageToken())
	if err != nil {
		return nil, err
	}
	out := &ctrlv1.ListNodesResponse{}
	err = s.Store.View(ctx, func(tx store.Tx) error {
		out.Nodes, out.NextPageToken = nil, ""
		nodes, err := tx.ListNodes(ctx)
		if err != nil {
			return err
		}
		v, err := Load(ctx, tx)
		if err != nil {
			return err
		}
		byID := map[string]*store.Node{}
		for _, n := range nodes {
			byID[n.ID] = n
		}
		all := make([]string, 0, len(byID)+len(v.Nodes))
		for id := range byID {
			all = append(all, id)
		}
		for id := range v.Nodes {
			if byID[id] == nil {
				all = append(all, id)
			}
		}
		slices.Sort(all)
		var page []string
		for _, id := range all {
			if after && id <= cur.ID {
				continue
			}
			rec := v.Nodes[id]
			if rec == nil {
				rec = implicitRecord(byID[id])
			}
			if rec.State == StateRetired && !req.GetIncludeRetired() {
				continue
			}
			if len(page) == size {
				out.NextPageToken = s.Pages.Encode(listKind, filter, paging.Cursor{ID: page[len(page)-1]})
				break
			}
			page = append(page, id)
		}
		if len(page) == 0 {
			return nil
		}
		vols, err := s.volumes(ctx, tx)
		if err != nil {
			return err
		}
		for _, id := range page {
			rec := v.Nodes[id]
			if rec == nil {
				rec = implicitRecord(byID[id])
			}
			n, err := s.show(ctx, tx, id, &loaded{node: byID[id], rec: rec}, v.Defaults, vols)
			if err != nil {
				return err
			}
			out.Nodes = append(out.Nodes, n)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// change is a node write's decision: it changes l.rec (and may write
// other rows in tx) and reports whether the record changed.
type change func(ctx context.Context, tx store.Tx, l *loaded, cmd *store.Command, now time.Time) (bool, error)

// nodeWrite runs a write of one node as a command: the node must exist,
// its registration version must be expected (else aborted,
// REVISION_MISMATCH), it must not be RETIRED; then decide changes its
// record, which is written (created for a node that had none) when it
// changed. The answer is the node afterwards.
func nodeWrite[Req command.OperatorInput, Resp proto.Message](ctx context.Context, s *Service, method string, req Req,
	id string, expected uint64, wrap func(*ctrlv1.Node) Resp, newResp func() Resp, decide change) (Resp, error) {
	var zero Resp
	if err := CheckNodeID("node_id", id); err != nil {
		return zero, err
	}
	resp, err := command.Execute(ctx, s.Engine, command.Spec[Req, Resp]{
		Method: method, ObjectKind: ObjectKind, ObjectID: id, Request: req, NewResponse: newResp,
		Decide: func(ctx context.Context, tx store.Tx, cmd *store.Command) (Resp, error) {
			l, err := s.load(ctx, tx, id)
			if err != nil {
				return zero, err
			}
			if l.rec.RegistrationVersion != expected {
				return zero, &fault.Error{Kind: fault.KindAborted, Reason: fault.ReasonRevisionMismatch, Field: "expected_registration_version",
					Message: fmt.Sprintf("node %s has registration version %d, not %d", id, l.rec.RegistrationVersion, expected)}
			}
			if l.rec.State == StateRetired {
				return zero, retiredRefusal(id)
			}
			now := s.now()
			changed, err := decide(ctx, tx, l, cmd, now)
			if err != nil {
				return zero, err
			}
			if changed || l.res == nil {
				if err := PutRecord(ctx, tx, l.res, id, l.rec, now); err != nil {
					return zero, err
				}
			}
			_, d, err := defaults(ctx, tx)
			if err != nil {
				return zero, err
			}
			vols, err := s.volumes(ctx, tx)
			if err != nil {
				return zero, err
			}
			n, err := s.show(ctx, tx, id, l, d, vols)
			if err != nil {
				return zero, err
			}
			return wrap(n), nil
		},
	})
	if err == nil {
		s.changed()
	}
	return resp, err
}

// setState moves rec to state st at now; the drain option is kept only in
// DRAINING.
func setState(rec *Record, st State, now time.Time) {
	if rec.State != st {
		rec.State, rec.StateChangedAt = st, now
	}
	if st != StateDraining {
		rec.DrainStopsWorkspaces, rec.DrainCommandID = false, ""
	}
}

func stateConflict(id string, st State, what string) error {
	return fault.Precondition(fault.ReasonStateConflict, "node %s is %s: %s", id, st, what)
}

// Drain serves DrainNode: ACTIVE becomes DRAINING; on a DRAINING node only
// stop_workspaces is updated. With stop_workspaces the node's running
// Workspaces are stopped in the same transaction (StopWorkspaces) when
// the option is newly set, and the record keeps the command's ID
// (DrainCommandID): while the node stays DRAINING with the option, the
// reconciler stops under IDs derived from it each Workspace of the node
// that becomes AVAILABLE. CancelNodeDrain, IsolateNode and a DrainNode
// without the option end that rule.
func (s *Service) Drain(ctx context.Context, req *ctrlv1.DrainNodeRequest) (*ctrlv1.DrainNodeResponse, error) {
	if req.GetStopWorkspaces() && s.StopWorkspaces == nil {
		return nil, &fault.Error{Kind: fault.KindUnimplemented, Reason: fault.ReasonCapabilityUnavailable, Field: "stop_workspaces",
			Message: "this ctrl cannot stop a drained node's Workspaces; drain without stop_workspaces and stop them one by one"}
	}
	id := req.GetNodeId()
	return nodeWrite(ctx, s, DrainMethod, req, id, req.GetExpectedRegistrationVersion(),
		func(n *ctrlv1.Node) *ctrlv1.DrainNodeResponse { return &ctrlv1.DrainNodeResponse{Node: n} },
		func() *ctrlv1.DrainNodeResponse { return &ctrlv1.DrainNodeResponse{} },
		func(ctx context.Context, tx store.Tx, l *loaded, cmd *store.Command, now time.Time) (bool, error) {
			rec := l.rec
			switch rec.State {
			case StateActive, "":
			case StateDraining:
				if rec.DrainStopsWorkspaces == req.GetStopWorkspaces() {
					return false, nil
				}
			default:
				return false, stateConflict(id, rec.State, "only an ACTIVE or DRAINING node can be drained; CancelNodeDrain returns an ISOLATED one to ACTIVE")
			}
			stop := req.GetStopWorkspaces() && !rec.DrainStopsWorkspaces
			setState(rec, StateDraining, now)
			rec.DrainStopsWorkspaces, rec.DrainCommandID = req.GetStopWorkspaces(), ""
			if stop {
				rec.DrainCommandID = cmd.ID
				if err := s.StopWorkspaces(ctx, tx, id, cmd.ID); err != nil {
					return false, err
				}
			}
			return true, nil
		})
}

// CancelDrain serves CancelNodeDrain: DRAINING or ISOLATED becomes ACTIVE;
// an ACTIVE node stays as it is.
func (s *Service) CancelDrain(ctx context.Context, req *ctrlv1.CancelNodeDrainRequest) (*ctrlv1.CancelNodeDrainResponse, error) {
	return nodeWrite(ctx, s, CancelDrainMethod, req, req.GetNodeId(), req.GetExpectedRegistrationVersion(),
		func(n *ctrlv1.Node) *ctrlv1.CancelNodeDrainResponse { return &ctrlv1.CancelNodeDrainResponse{Node: n} },
		func() *ctrlv1.CancelNodeDrainResponse { return &ctrlv1.CancelNodeDrainResponse{} },
		func(_ context.Context, _ store.Tx, l *loaded, _ *store.Command, now time.Time) (bool, error) {
			if l.rec.State == StateActive {
				return false, nil
			}
			setState(l.rec, StateActive, now)
			return true, nil
		})
}

// Isolate serves IsolateNode: ACTIVE or DRAINING becomes ISOLATED; an
// ISOLATED node stays as it is. EndDataPlane runs after the commit.
func (s *Service) Isolate(ctx context.Context, req *ctrlv1.IsolateNodeRequest) (*ctrlv1.IsolateNodeResponse, error) {
	resp, err := nodeWrite(ctx, s, IsolateMethod, req, req.GetNodeId(), req.GetExpectedRegistrationVersion(),
		func(n *ctrlv1.Node) *ctrlv1.IsolateNodeResponse { return &ctrlv1.IsolateNodeResponse{Node: n} },
		func() *ctrlv1.IsolateNodeResponse { return &ctrlv1.IsolateNodeResponse{} },
		func(_ context.Context, _ store.Tx, l *loaded, _ *store.Command, now time.Time) (bool, error) {
			if l.rec.State == StateIsolated {
				return false, nil
			}
			setState(l.rec, StateIsolated, now)
			return true, nil
		})
	if err == nil && s.EndDataPlane != nil {
		s.EndDataPlane(req.GetNodeId())
	}
	return resp, err
}

// Retire serves RetireNode: a DRAINING or ISOLATED node that holds no
// Workspace whose deletion has not completed and no Volume that is not
// deleted becomes RETIRED, and its certificate key (the store's, else the
// one its record keeps; both when they differ) is denied in the same
// transaction. A node with no known key is retired all the same: the
// command's message says so. EndKey runs after the commit.
func (s *Service) Retire(ctx context.Context, req *ctrlv1.RetireNodeRequest) (*ctrlv1.RetireNodeResponse, error) {
	id := req.GetNodeId()
	var denied [][]byte
	resp, err := nodeWrite(ctx, s, RetireMethod, req, id, req.GetExpectedRegistrationVersion(),
		func(n *ctrlv1.Node) *ctrlv1.RetireNodeResponse { return &ctrlv1.RetireNodeResponse{Node: n} },
		func() *ctrlv1.RetireNodeResponse { return &ctrlv1.RetireNodeResponse{} },
		func(ctx context.Context, tx store.Tx, l *loaded, cmd *store.Command, now time.Time) (bool, error) {
			denied = nil
			if st := l.rec.State; st != StateDraining && st != StateIsolated {
				return false, stateConflict(id, st, "only a DRAINING or ISOLATED node can be retired; drain it first")
			}
			on, err := tx.WorkspacesOnNode(ctx, id)
			if err != nil {
				return false, err
			}
			vols, err := s.volumes(ctx, tx)
			if err != nil {
				return false, err
			}
			if w, v := len(on), vols[id].Count; w > 0 || v > 0 {
				return false, fault.Precondition(fault.ReasonStateConflict,
					"node %s still holds %d Workspace(s) whose deletion has not completed and %d Volume(s) not deleted; delete them (or wait for their deletion) first", id, w, v)
			}
			var keys [][]byte
			if l.node != nil && len(l.node.CertKeyHash) > 0 {
				keys = append(keys, l.node.CertKeyHash)
			}
			if len(l.rec.KeyHash) > 0 && (len(keys) == 0 || string(keys[0]) != string(l.rec.KeyHash)) {
				keys = append(keys, l.rec.KeyHash)
			}
			for _, k := range keys {
				if err := tx.DenyNodeKey(ctx, &store.DeniedNodeKey{KeyHash: k, NodeID: id, DeniedAt: now,
					Reason: "node retired (RetireNode, command " + cmd.ID + ")"}); err != nil {
					return false, err
				}
			}
			if len(keys) == 0 {
				cmd.Message = "node " + id + " had no known certificate key: nothing was denied; a certificate issued for it by hand still connects until it expires"
			}
			denied = keys
			setState(l.rec, StateRetired, now)
			return true, nil
		})
	if err == nil && s.EndKey != nil {
		for _, k := range denied {
			s.EndKey(k)
		}
	}
	return resp, err
}

// SetOvercommit serves SetNodeOvercommit: the node's own ratios, or, with
// overcommit unset, none (it inherits).
func (s *Service) SetOvercommit(ctx context.Context, req *ctrlv1.SetNodeOvercommitRequest) (*ctrlv1.SetNodeOvercommitResponse, error) {
	var own *Ratios
	if o := req.GetOvercommit(); o != nil {
		own = &Ratios{Memory: o.GetMemoryRatio(), CPU: o.GetCpuRatio()}
		if err := own.Check("overcommit"); err != nil {
			return nil, err
		}
	}
	return nodeWrite(ctx, s, SetOvercommitMethod, req, req.GetNodeId(), req.GetExpectedRegistrationVersion(),
		func(n *ctrlv1.Node) *ctrlv1.SetNodeOvercommitResponse {
			return &ctrlv1.SetNodeOvercommitResponse{Node: n}
		},
		func() *ctrlv1.SetNodeOvercommitResponse { return &ctrlv1.SetNodeOvercommitResponse{} },
		func(_ context.Context, _ store.Tx, l *loaded, _ *store.Command, _ time.Time) (bool, error) {
			old := l.rec.Overcommit
			if (old == nil && own == nil) || (old != nil && own != nil && *old == *own) {
				return false, nil
			}
			l.rec.Overcommit = own
			return true, nil
		})
}

// defaultsMessage is the API's OvercommitDefaults of row r (nil: never
// set).
func defaultsMessage(r *store.Resource, d Ratios) *ctrlv1.OvercommitDefaults {
	out := &ctrlv1.OvercommitDefaults{Overcommit: d.Proto()}
	if r != nil {
		out.Version, out.UpdatedAt = r.Revision, ts(r.UpdatedAt)
	}
	return out
}

// GetDefaults serves GetOvercommitDefaults.
func (s *Service) GetDefaults(ctx context.Context) (*ctrlv1.OvercommitDefaults, error) {
	var out *ctrlv1.OvercommitDefaults
	err := s.Store.View(ctx, func(tx store.Tx) error {
		r, d, err := defaults(ctx, tx)
		out = defaultsMessage(r, d)
		return err
	})
	return out, err
}

// SetDefaults serves SetOvercommitDefaults: overcommit is required;
// expected_version must equal the defaults' version (0 until first set).
// Setting the ratios they have already keeps the version.
func (s *Service) SetDefaults(ctx context.Context, req *ctrlv1.SetOvercommitDefaultsRequest) (*ctrlv1.SetOvercommitDefaultsResponse, error) {
	o := req.GetOvercommit()
	if o == nil {
		return nil, fault.Invalid("overcommit", "overcommit is required")
	}
	want := Ratios{Memory: o.GetMemoryRatio(), CPU: o.GetCpuRatio()}
	if err := want.Check("overcommit"); err != nil {
		return nil, err
	}
	resp, err := command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.SetOvercommitDefaultsRequest, *ctrlv1.SetOvercommitDefaultsResponse]{
		Method: SetDefaultsMethod, ObjectKind: ObjectKind, ObjectID: DefaultsID, Request: req,
		NewResponse: func() *ctrlv1.SetOvercommitDefaultsResponse { return &ctrlv1.SetOvercommitDefaultsResponse{} },
		Decide: func(ctx context.Context, tx store.Tx, _ *store.Command) (*ctrlv1.SetOvercommitDefaultsResponse, error) {
			r, d, err := defaults(ctx, tx)
			if err != nil {
				return nil, err
			}
			if err := checkVersion(r, req.GetExpectedVersion(), "the overcommit defaults"); err != nil {
				return nil, err
			}
			if r == nil || d != want {
				if r, err = putJSON(ctx, tx, r, KindDefaults, DefaultsID, want, s.now()); err != nil {
					return nil, err
				}
			}
			return &ctrlv1.SetOvercommitDefaultsResponse{Defaults: defaultsMessage(r, want)}, nil
		},
	})
	if err == nil {
		s.changed()
	}
	return resp, err
}

// SetPoolCapacity serves SetStoragePoolCapacity: the node must exist and
// report the pool (else not_found), and not be RETIRED; capacity_bytes is
// a whole number of MiB, zero clears the override; expected_version must
// equal the pool's version (0 until its capacity is first set). The row
// stays when the override is cleared, so that its version only grows.
func (s *Service) SetPoolCapacity(ctx context.Context, req *ctrlv1.SetStoragePoolCapacityRequest) (*ctrlv1.SetStoragePoolCapacityResponse, error) {
	id, poolID, capacity := req.GetNodeId(), req.GetPoolId(), req.GetCapacityBytes()
	if err := CheckNodeID("node_id", id); err != nil {
		return nil, err
	}
	if poolID == "" {
		return nil, fault.Invalid("pool_id", "pool_id is required")
	}
	if capacity%MiB != 0 {
		return nil, fault.Invalid("capacity_bytes", "capacity_bytes must be a whole number of MiB (a multiple of %d), not %d", MiB, capacity)
	}
	resp, err := command.Execute(ctx, s.Engine, command.Spec[*ctrlv1.SetStoragePoolCapacityRequest, *ctrlv1.SetStoragePoolCapacityResponse]{
		Method: SetPoolCapacityMethod, ObjectKind: ObjectKind, ObjectID: id, Request: req,
		NewResponse: func() *ctrlv1.SetStoragePoolCapacityResponse { return &ctrlv1.SetStoragePoolCapacityResponse{} },
		Decide: func(ctx context.Context, tx store.Tx, _ *store.Command) (*ctrlv1.SetStoragePoolCapacityResponse, error) {
			l, err := s.load(ctx, tx, id)
			if err != nil {
				return nil, err
			}
			n := l.node
			if n == nil {
				n = &store.Node{ID: id}
			}
			if reported := hello(n).GetCapacity().GetStoragePool(); reported != poolID {
				fe := fault.NotFound("storage pool", ids.Truncate(poolID))
				fe.Field = "pool_id"
				if reported != "" {
					fe.Message += fmt.Sprintf(" on node %s (it reports the pool %q)", id, reported)
				} else {
					fe.Message += fmt.Sprintf(" on node %s (it reports no storage pool)", id)
				}
				return nil, fe
			}
			if l.rec.State == StateRetired {
				return nil, retiredRefusal(id)
			}
			r, p, err := GetPool(ctx, tx, id, poolID)
			if err != nil {
				return nil, err
			}
			if err := checkVersion(r, req.GetExpectedVersion(), fmt.Sprintf("storage pool %s of node %s", poolID, id)); err != nil {
				return nil, err
			}
			if p.OverrideBytes != capacity {
				p.OverrideBytes = capacity
				if _, err := putJSON(ctx, tx, r, KindPool, PoolKey(id, poolID), p, s.now()); err != nil {
					return nil, err
				}
			}
			u, err := tx.NodeUsage(ctx, id)
			if err != nil {
				return nil, err
			}
			vols, err := s.volumes(ctx, tx)
			if err != nil {
				return nil, err
			}
			out, err := s.poolOf(ctx, tx, n, poolID, u.LayerBytes, vols[id].Bytes)
			if err != nil {
				return nil, err
			}
			return &ctrlv1.SetStoragePoolCapacityResponse{Pool: out}, nil
		},
	})
	if err == nil {
		s.changed()
	}
	return resp, err
}
