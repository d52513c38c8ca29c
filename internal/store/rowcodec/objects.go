package rowcodec

import (
	"fmt"

	"github.com/kibotos/kibotos/internal/store"
)

// CommandColumns are the columns of commands, in the order ScanCommand reads
// them and CommandArgs returns their values.
const CommandColumns = `command_id, method, fingerprint, object_kind, object_id, kind, initiator,
	status, result, error_code, error_detail, created_at, completed_at, message, caller`

// ScanCommand scans CommandColumns; N is the driver's nullable BIGINT.
func ScanCommand[N NullInt64](row Scanner) (*store.Command, error) {
	var (
		c                   store.Command
		kind, initr, status int64
		created             int64
		completed           N
	)
	if err := row.Scan(&c.ID, &c.Method, &c.Fingerprint, &c.ObjectKind, &c.ObjectID, &kind, &initr,
		&status, &c.Result, &c.ErrorCode, &c.ErrorDetail, &created, &completed, &c.Message, &c.Caller); err != nil {
		return nil, err
	}
	c.Kind, c.Initiator, c.Status = int(kind), int(initr), store.CommandStatus(status)
	c.Fingerprint, c.Result, c.ErrorDetail = EmptyNil(c.Fingerprint), EmptyNil(c.Result), EmptyNil(c.ErrorDetail)
	c.CreatedAt, c.CompletedAt = FromMicros(created), fromOptMicros(completed)
	return &c, nil
}

// CommandArgs returns the values of CommandColumns for c.
func CommandArgs(c *store.Command) []any {
	return []any{c.ID, c.Method, NonNil(c.Fingerprint), c.ObjectKind, c.ObjectID, int64(c.Kind), int64(c.Initiator),
		int64(c.Status), NonNil(c.Result), c.ErrorCode, NonNil(c.ErrorDetail), Micros(c.CreatedAt), OptMicros(c.CompletedAt),
		c.Message, c.Caller}
}

// CommandUpdateArgs returns the values of the mutable columns of commands,
// status, result, error_code, error_detail and completed_at, for c
// (message and caller are written once, by CommandArgs).
func CommandUpdateArgs(c *store.Command) []any {
	return []any{int64(c.Status), NonNil(c.Result), c.ErrorCode, NonNil(c.ErrorDetail), OptMicros(c.CompletedAt)}
}

// ResourceColumns are the columns of resources (as r) that ScanResource
// reads, in order. ResourceColumnsWithLabels adds labels, the JSON copy of
// a resource's labels that SQLite keeps in the row; ScanResourceWithLabels
// reads them.
const (
	ResourceColumns = `r.kind, r.id, r.created_at, r.updated_at, r.revision, r.spec,
	r.labels_revision, r.annotations, r.annotations_revision, r.drain_seconds`
	ResourceColumnsWithLabels = `r.kind, r.id, r.created_at, r.updated_at, r.revision, r.spec,
	r.labels, r.labels_revision, r.annotations, r.annotations_revision, r.drain_seconds`
)

// ScanResource scans ResourceColumns; Labels is left empty, for the caller
// to fill from the labels table.
func ScanResource(row Scanner) (*store.Resource, error) { return scanResource(row, false) }

// ScanResourceWithLabels scans ResourceColumnsWithLabels.
func ScanResourceWithLabels(row Scanner) (*store.Resource, error) { return scanResource(row, true) }

func scanResource(row Scanner, withLabels bool) (*store.Resource, error) {
	var (
		r                              store.Resource
		kind, labels, annotations      string
		created, updated               int64
		rev, labelsRev, annotationsRev int64
		drain                          int64
	)
	dest := []any{&kind, &r.ID, &created, &updated, &rev, &r.Spec, &labels, &labelsRev, &annotations, &annotationsRev, &drain}
	if !withLabels {
		dest = append(dest[:6], dest[7:]...)
	}
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	r.Kind = store.ResourceKind(kind)
	r.CreatedAt, r.UpdatedAt = FromMicros(created), FromMicros(updated)
	r.Revision, r.LabelsRevision, r.AnnotationsRevision = uint64(rev), uint64(labelsRev), uint64(annotationsRev)
	r.DrainSeconds = uint32(drain)
	r.Spec = EmptyNil(r.Spec)
	var err error
	if !withLabels {
		r.Labels = map[string]string{}
	} else if r.Labels, err = JSONMap(labels); err != nil {
		return nil, fmt.Errorf("store: resource %s/%s: labels: %w", kind, r.ID, err)
	}
	if r.Annotations, err = JSONMap(annotations); err != nil {
		return nil, fmt.Errorf("store: resource %s/%s: annotations: %w", kind, r.ID, err)
	}
	return &r, nil
}

// ResourceArgs returns the values of the mutable columns of r but spec and
// labels: revision, labels_revision, annotations (MapJSON) and
// annotations_revision.
func ResourceArgs(r *store.Resource) (rev, labelsRev, annotationsRev int64, annotations string, err error) {
	if rev, err = U2I("revision", r.Revision); err != nil {
		return
	}
	if labelsRev, err = U2I("labels revision", r.LabelsRevision); err != nil {
		return
	}
	if annotationsRev, err = U2I("annotations revision", r.AnnotationsRevision); err != nil {
		return
	}
	annotations, err = MapJSON(r.Annotations)
	return
}

// WorkspaceColumns are the columns of workspaces (as w) that ScanWorkspace
// reads, in order.
const WorkspaceColumns = `w.id, w.created_at, w.updated_at, w.deleted_at, w.doc, w.state, w.guest_condition,
	w.node_id, w.power, w.force_stop, w.generation, w.command_id,
	w.observed_generation, w.observed_state, w.holds_execution, w.observed_at,
	w.policy_drain_seconds, w.exec_dns_version, w.expiration_deadline, w.memory_mib, w.layer_bytes,
	w.cpu_millis, w.template_key`

// WorkspaceMutable lists the mutable columns of workspaces, in the order
// WorkspaceArgs returns their values.
var WorkspaceMutable = []string{"updated_at", "deleted_at", "doc", "state", "guest_condition",
	"node_id", "power", "force_stop", "generation", "command_id",
	"observed_generation", "observed_state", "holds_execution", "observed_at",
	"policy_drain_seconds", "exec_dns_version", "expiration_deadline", "memory_mib", "layer_bytes",
	"cpu_millis", "template_key"}

// ScanWorkspace scans WorkspaceColumns; N is the driver's nullable BIGINT.
// Labels is left empty, for the caller to fill from the labels table.
// force_stop and holds_execution are BOOLEAN in PostgreSQL and 0 or 1 in
// SQLite, both of which scan into a bool.
func ScanWorkspace[N NullInt64](row Scanner) (*store.Workspace, error) {
	var (
		w                                  store.Workspace
		created, updated                   int64
		deleted, observed, expiration      N
		state, guest, power, observedState int64
		gen, observedGen                   int64
		drain, dnsVersion                  int64
		memory, layer, cpu                 int64
	)
	if err := row.Scan(&w.ID, &created, &updated, &deleted, &w.Doc, &state, &guest,
		&w.NodeID, &power, &w.ForceStop, &gen, &w.CommandID,
		&observedGen, &observedState, &w.HoldsExecution, &observed, &drain, &dnsVersion, &expiration, &memory, &layer,
		&cpu, &w.TemplateKey); err != nil {
		return nil, err
	}
	w.CreatedAt, w.UpdatedAt = FromMicros(created), FromMicros(updated)
	w.DeletedAt, w.ObservedAt = fromOptMicros(deleted), fromOptMicros(observed)
	w.Doc = EmptyNil(w.Doc)
	w.Labels = map[string]string{}
	w.State, w.GuestCondition, w.Power = int32(state), int32(guest), store.Power(power)
	w.Generation, w.ObservedGeneration = uint64(gen), uint64(observedGen)
	w.ObservedState = store.ExecState(observedState)
	w.PolicyDrainSeconds, w.ExecDNSVersion = uint32(drain), uint32(dnsVersion)
	w.ExpirationDeadline = fromOptMicros(expiration)
	w.MemoryMiB, w.LayerBytes, w.CPUMillis = uint64(memory), uint64(layer), uint64(cpu)
	return &w, nil
}

// WorkspaceArgs returns the values of WorkspaceMutable for w. Bools are
// bools: SQLite's driver stores them as 1 and 0.
func WorkspaceArgs(w *store.Workspace) ([]any, error) {
	gen, err := U2I("generation", w.Generation)
	if err != nil {
		return nil, err
	}
	observedGen, err := U2I("observed generation", w.ObservedGeneration)
	if err != nil {
		return nil, err
	}
	memory, err := U2I("memory", w.MemoryMiB)
	if err != nil {
		return nil, err
	}
	layer, err := U2I("layer bytes", w.LayerBytes)
	if err != nil {
		return nil, err
	}
	cpu, err := U2I("cpu", w.CPUMillis)
	if err != nil {
		return nil, err
	}
	return []any{Micros(w.UpdatedAt), OptMicros(w.DeletedAt), NonNil(w.Doc), int64(w.State), int64(w.GuestCondition),
		w.NodeID, int64(w.Power), w.ForceStop, gen, w.CommandID,
		observedGen, int64(w.ObservedState), w.HoldsExecution, OptMicros(w.ObservedAt),
		int64(w.PolicyDrainSeconds), int64(w.ExecDNSVersion), OptMicros(w.ExpirationDeadline), memory, layer,
		cpu, w.TemplateKey}, nil
}

// NodeColumns are the columns of nodes, in the order ScanNode reads them and
// NodeArgs returns their values.
const NodeColumns = `id, created_at, last_seen, memory_mib, cpu_millis, storage_bytes, doc, cert_key_hash, epoch, revision`

// NodeStateColumns are the columns of nodes ScanNodeState reads.
const NodeStateColumns = `id, last_seen, epoch, revision`

// ScanNodeState scans NodeStateColumns.
func ScanNodeState(row Scanner) (store.NodeState, error) {
	var n store.NodeState
	var seen int64
	if err := row.Scan(&n.ID, &seen, &n.Epoch, &n.Revision); err != nil {
		return n, err
	}
	n.LastSeen = FromMicros(seen)
	return n, nil
}

// ScanInt64 scans one integer column (a node's epoch).
func ScanInt64(row Scanner) (int64, error) {
	var v int64
	err := row.Scan(&v)
	return v, err
}

// ScanNode scans NodeColumns.
func ScanNode(row Scanner) (*store.Node, error) {
	var (
		n                 store.Node
		created, seen     int64
		memory, cpu, stor int64
	)
	if err := row.Scan(&n.ID, &created, &seen, &memory, &cpu, &stor, &n.Doc, &n.CertKeyHash, &n.Epoch, &n.Revision); err != nil {
		return nil, err
	}
	n.CreatedAt, n.LastSeen = FromMicros(created), FromMicros(seen)
	n.MemoryMiB, n.CPUMillis, n.StorageBytes = uint64(memory), uint64(cpu), uint64(stor)
	n.Doc, n.CertKeyHash = EmptyNil(n.Doc), EmptyNil(n.CertKeyHash)
	return &n, nil
}

// NodeArgs returns the values of NodeColumns for n.
func NodeArgs(n *store.Node) ([]any, error) {
	memory, err := U2I("memory", n.MemoryMiB)
	if err != nil {
		return nil, err
	}
	cpu, err := U2I("cpu", n.CPUMillis)
	if err != nil {
		return nil, err
	}
	stor, err := U2I("storage", n.StorageBytes)
	if err != nil {
		return nil, err
	}
	// revision: 1 for a new row; UpsertNode's conflict clause increases
	// the stored one instead.
	return []any{n.ID, Micros(n.CreatedAt), Micros(n.LastSeen), memory, cpu, stor, NonNil(n.Doc), NonNil(n.CertKeyHash), n.Epoch, int64(1)}, nil
}

// DeniedNodeKeyColumns are the columns of denied_node_keys, in the order
// ScanDeniedNodeKey reads them and DeniedNodeKeyArgs returns their values.
const DeniedNodeKeyColumns = `key_hash, node_id, denied_at, reason`

// ScanDeniedNodeKey scans DeniedNodeKeyColumns.
func ScanDeniedNodeKey(row Scanner) (*store.DeniedNodeKey, error) {
	var (
		k      store.DeniedNodeKey
		denied int64
	)
	if err := row.Scan(&k.KeyHash, &k.NodeID, &denied, &k.Reason); err != nil {
		return nil, err
	}
	k.DeniedAt = FromMicros(denied)
	return &k, nil
}

// DeniedNodeKeyArgs returns the values of DeniedNodeKeyColumns for k; a key
// hash must not be empty.
func DeniedNodeKeyArgs(k *store.DeniedNodeKey) ([]any, error) {
	if len(k.KeyHash) == 0 {
		return nil, fmt.Errorf("store: a denied node key needs its hash")
	}
	return []any{k.KeyHash, k.NodeID, Micros(k.DeniedAt), k.Reason}, nil
}
