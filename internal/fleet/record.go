// Package fleet keeps what operators decide about nodes (the Operator
// API's NodeService): each node's state (ACTIVE, DRAINING, ISOLATED,
// RETIRED), registration version and overcommit, the fleet's overcommit
// defaults, and the capacity overrides of storage pools. The records live
// in the store as resources; View is the read-only picture of all of them
// that placement consults.
package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/store"
)

// Store kinds of the fleet's records.
const (
	// KindNode: one Record per node, ID = node ID. Revision is the row's
	// own counter; the CAS of NodeService is Record.RegistrationVersion.
	KindNode store.ResourceKind = "node-admin"
	// KindDefaults: the overcommit defaults, ID DefaultsID; Revision is
	// OvercommitDefaults.version.
	KindDefaults store.ResourceKind = "overcommit-defaults"
	// KindPool: one per storage pool whose capacity was set, ID
	// PoolKey(node, pool); Revision is StoragePool.version.
	KindPool store.ResourceKind = "storage-pool"

	// DefaultsID is the ID of the overcommit defaults' row.
	DefaultsID = "default"
)

// Bounds of overcommit ratios: a node never admits more than its ratio
// allows, and the host-memory policy is the safety net beneath.
const (
	MinRatio       = 1.0
	MaxMemoryRatio = 4.0
	MaxCPURatio    = 64.0
)

// BuiltinDefaults are the overcommit defaults until SetOvercommitDefaults
// is called: memory is never overcommitted, CPU is shared up to four times.
var BuiltinDefaults = Ratios{Memory: 1, CPU: 4}

// State is a node's state, as ctrlv1.NodeState names it.
type State string

// States.
const (
	StateActive   State = "ACTIVE"
	StateDraining State = "DRAINING"
	StateIsolated State = "ISOLATED"
	StateRetired  State = "RETIRED"
)

// Proto returns the API enum of s.
func (s State) Proto() ctrlv1.NodeState {
	switch s {
	case StateActive, "":
		return ctrlv1.NodeState_NODE_STATE_ACTIVE
	case StateDraining:
		return ctrlv1.NodeState_NODE_STATE_DRAINING
	case StateIsolated:
		return ctrlv1.NodeState_NODE_STATE_ISOLATED
	case StateRetired:
		return ctrlv1.NodeState_NODE_STATE_RETIRED
	}
	return ctrlv1.NodeState_NODE_STATE_UNSPECIFIED
}

// Placeable reports whether new Workspaces may be placed on a node in s.
func (s State) Placeable() bool { return s == StateActive || s == "" }

// Ratios are overcommit ratios.
type Ratios struct {
	Memory float64 `json:"memory"`
	CPU    float64 `json:"cpu"`
}

// Check validates r as request field field (absurd or below 1 is
// invalid_argument).
func (r Ratios) Check(field string) error {
	if !(r.Memory >= MinRatio && r.Memory <= MaxMemoryRatio) || math.IsNaN(r.Memory) {
		return fault.Invalid(field+".memory_ratio", "memory_ratio must be from %g to %g, not %g", MinRatio, MaxMemoryRatio, r.Memory)
	}
	if !(r.CPU >= MinRatio && r.CPU <= MaxCPURatio) || math.IsNaN(r.CPU) {
		return fault.Invalid(field+".cpu_ratio", "cpu_ratio must be from %g to %g, not %g", MinRatio, MaxCPURatio, r.CPU)
	}
	return nil
}

// Proto returns r as the API message.
func (r Ratios) Proto() *ctrlv1.Overcommit {
	return &ctrlv1.Overcommit{MemoryRatio: r.Memory, CpuRatio: r.CPU}
}

// Record is what operators decided about one node (KindNode's spec, JSON).
type Record struct {
	// RegistrationVersion is 1 at the node's first registration and grows
	// by one at each re-enrollment (a new key).
	RegistrationVersion uint64    `json:"registration_version"`
	State               State     `json:"state"`
	StateChangedAt      time.Time `json:"state_changed_at"`
	// DrainStopsWorkspaces: drained with stop_workspaces. While the node
	// stays DRAINING with it, the rule stands: a Workspace of the node that
	// becomes AVAILABLE is stopped as well (the reconciler's loop).
	DrainStopsWorkspaces bool `json:"drain_stops_workspaces,omitempty"`
	// DrainCommandID is the command ID of the DrainNode that set
	// stop_workspaces: the stops of the rule are recorded under IDs
	// derived from it (workspace.DrainStopCommandID,
	// workspace.DrainRuleStopCommandID). Empty whenever
	// DrainStopsWorkspaces is false; a record written before the field
	// existed has none, and its rule is not applied by the loop.
	DrainCommandID string `json:"drain_command_id,omitempty"`
	// Overcommit is the node's own ratios; nil inherits.
	Overcommit *Ratios `json:"overcommit,omitempty"`
	// KeyHash is the key (pki.PublicKeyHash) the node last registered
	// with: what RetireNode denies when the node's certificate was issued
	// by hand (store.Node.CertKeyHash empty).
	KeyHash []byte `json:"key_hash,omitempty"`
}

// PoolRecord is KindPool's spec (JSON).
type PoolRecord struct {
	// OverrideBytes is the capacity set; zero: none.
	OverrideBytes uint64 `json:"override_bytes"`
}

// Capacity is the capacity ctrl accounts a pool at: the override when one
// is set and smaller than reported (what the node reports), else reported.
func (p PoolRecord) Capacity(reported uint64) uint64 {
	if p.OverrideBytes > 0 && p.OverrideBytes < reported {
		return p.OverrideBytes
	}
	return reported
}

// GetPool reads the record of pool poolID of nodeID inside tx: its row (nil
// when its capacity was never set) and the record (empty then).
func GetPool(ctx context.Context, tx store.Tx, nodeID, poolID string) (*store.Resource, *PoolRecord, error) {
	r, err := tx.GetResource(ctx, KindPool, PoolKey(nodeID, poolID))
	if errors.Is(err, store.ErrNotFound) {
		return nil, &PoolRecord{}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var p PoolRecord
	if err := json.Unmarshal(r.Spec, &p); err != nil {
		return nil, nil, fault.Internal("decode storage pool %s: %v", r.ID, err)
	}
	return r, &p, nil
}

// PoolKey is the ID of a storage pool's row.
func PoolKey(nodeID, poolID string) string { return nodeID + "/" + poolID }

// Decode reads a KindNode row.
func Decode(r *store.Resource) (*Record, error) {
	var rec Record
	if err := json.Unmarshal(r.Spec, &rec); err != nil {
		return nil, fault.Internal("decode node record %s: %v", r.ID, err)
	}
	return &rec, nil
}

// GetRecord reads a node's record inside tx; ErrNotFound (store) when the
// node never registered.
func GetRecord(ctx context.Context, tx store.Tx, nodeID string) (*store.Resource, *Record, error) {
	r, err := tx.GetResource(ctx, KindNode, nodeID)
	if err != nil {
		return nil, nil, err
	}
	rec, err := Decode(r)
	return r, rec, err
}

// PutRecord writes rec as the row of nodeID (inserting it when r is nil).
func PutRecord(ctx context.Context, tx store.Tx, r *store.Resource, nodeID string, rec *Record, now time.Time) error {
	_, err := putJSON(ctx, tx, r, KindNode, nodeID, rec, now)
	return err
}

// putJSON writes v, JSON-encoded, as the spec of the row r, moving its
// revision on; when r is nil it inserts the row kind/id at revision 1. It
// returns the row written.
func putJSON(ctx context.Context, tx store.Tx, r *store.Resource, kind store.ResourceKind, id string, v any, now time.Time) (*store.Resource, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fault.Internal("encode %s: %v", kind, err)
	}
	if r == nil {
		r = &store.Resource{Kind: kind, ID: id, CreatedAt: now, UpdatedAt: now,
			Revision: 1, Spec: b, LabelsRevision: 1, AnnotationsRevision: 1,
			Labels: map[string]string{}, Annotations: map[string]string{}}
		return r, tx.InsertResource(ctx, r)
	}
	r.Spec, r.UpdatedAt, r.Revision = b, now, r.Revision+1
	return r, tx.UpdateResource(ctx, r)
}

// checkVersion compares the version of the row r (zero when there is none
// yet) with the request's expected_version: a mismatch is aborted
// (REVISION_MISMATCH); what names the object in the message.
func checkVersion(r *store.Resource, expected uint64, what string) error {
	var have uint64
	if r != nil {
		have = r.Revision
	}
	if have == expected {
		return nil
	}
	return &fault.Error{Kind: fault.KindAborted, Reason: fault.ReasonRevisionMismatch, Field: "expected_version",
		Message: fmt.Sprintf("%s: the version is %d, not %d", what, have, expected)}
}

// Register records, inside tx, that node nodeID registered with the key
// keyHash: its record is created (registration version 1, ACTIVE) when
// absent; reenrolled (a new enrollment issued it a certificate) moves the
// registration version on. A RETIRED node never registers:
// failed_precondition.
func Register(ctx context.Context, tx store.Tx, nodeID string, keyHash []byte, reenrolled bool, now time.Time) (*Record, error) {
	r, rec, err := GetRecord(ctx, tx, nodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		rec = &Record{RegistrationVersion: 1, State: StateActive, StateChangedAt: now, KeyHash: keyHash}
		return rec, PutRecord(ctx, tx, nil, nodeID, rec, now)
	case err != nil:
		return nil, err
	}
	if rec.State == StateRetired {
		return nil, Retired(nodeID)
	}
	changed := false
	if reenrolled {
		rec.RegistrationVersion++
		changed = true
	}
	if len(keyHash) > 0 && string(keyHash) != string(rec.KeyHash) {
		rec.KeyHash, changed = keyHash, true
	}
	if !changed {
		return rec, nil
	}
	return rec, PutRecord(ctx, tx, r, nodeID, rec, now)
}

// Retired is the refusal of anything a RETIRED node ID would do.
func Retired(nodeID string) error {
	return &fault.Error{Kind: fault.KindFailedPrecondition, Reason: fault.ReasonStateConflict,
		Message: fmt.Sprintf("node %q is retired: its ID is a tombstone that no node can take over", nodeID)}
}

// View is the fleet as placement sees it: every node's record, the
// defaults and the pool overrides, read at one moment.
type View struct {
	Nodes    map[string]*Record
	Defaults Ratios
	// DefaultsVersion is the defaults' version (0: built in).
	DefaultsVersion uint64
	// Pools maps PoolKey to the override set (bytes; absent: none).
	Pools map[string]uint64
}

// Load reads the View inside tx.
func Load(ctx context.Context, tx store.Tx) (*View, error) {
	v := &View{Nodes: map[string]*Record{}, Defaults: BuiltinDefaults, Pools: map[string]uint64{}}
	if err := eachResource(ctx, tx, KindNode, func(r *store.Resource) error {
		rec, err := Decode(r)
		if err == nil {
			v.Nodes[r.ID] = rec
		}
		return err
	}); err != nil {
		return nil, err
	}
	if err := eachResource(ctx, tx, KindPool, func(r *store.Resource) error {
		var p PoolRecord
		if err := json.Unmarshal(r.Spec, &p); err != nil {
			return fault.Internal("decode storage pool %s: %v", r.ID, err)
		}
		if p.OverrideBytes > 0 {
			v.Pools[r.ID] = p.OverrideBytes
		}
		return nil
	}); err != nil {
		return nil, err
	}
	d, err := tx.GetResource(ctx, KindDefaults, DefaultsID)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		if err := json.Unmarshal(d.Spec, &v.Defaults); err != nil {
			return nil, fault.Internal("decode overcommit defaults: %v", err)
		}
		v.DefaultsVersion = d.Revision
	}
	return v, nil
}

// State returns a node's state (ACTIVE for a node without a record yet).
func (v *View) State(nodeID string) State {
	if rec := v.Nodes[nodeID]; rec != nil && rec.State != "" {
		return rec.State
	}
	return StateActive
}

// Ratios returns the ratios placement applies to a node: its own, else
// those its agent reports (kibotos-node --memory-overcommit-ratio, for
// memory; zero when not given), else the defaults; and whether they are
// inherited (not the node's own).
func (v *View) Ratios(nodeID string, agentMemoryRatio float64) (Ratios, bool) {
	if rec := v.Nodes[nodeID]; rec != nil && rec.Overcommit != nil {
		return *rec.Overcommit, false
	}
	r := v.Defaults
	if agentMemoryRatio >= MinRatio && agentMemoryRatio <= MaxMemoryRatio {
		r.Memory = agentMemoryRatio
	}
	return r, true
}

// PoolCapacity is the capacity ctrl accounts a pool at: the override when
// set and smaller than reported, else reported.
func (v *View) PoolCapacity(nodeID, poolID string, reported uint64) uint64 {
	return PoolRecord{OverrideBytes: v.Pools[PoolKey(nodeID, poolID)]}.Capacity(reported)
}

// Apply multiplies a capacity by a ratio, rounding down.
func Apply(capacity uint64, ratio float64) uint64 {
	if ratio < MinRatio {
		ratio = MinRatio
	}
	return uint64(math.Floor(float64(capacity) * ratio))
}

// eachResource calls fn for every resource of kind, in pages.
func eachResource(ctx context.Context, tx store.Tx, kind store.ResourceKind, fn func(*store.Resource) error) error {
	var after *store.Cursor
	for {
		page, err := tx.ListResources(ctx, store.ListQuery{Kind: kind, After: after, Limit: 500})
		if err != nil {
			return err
		}
		for _, r := range page {
			if err := fn(r); err != nil {
				return err
			}
		}
		if len(page) < 500 {
			return nil
		}
		last := page[len(page)-1]
		after = &store.Cursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
}
