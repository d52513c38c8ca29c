// Package reconciler drives each Workspace's observed state towards its
// desired state: it places Workspaces on nodes, pushes desired state down the
// node streams (NodeService), folds the nodes' reports back into the store,
// completes commands when the observed generation catches up, and turns the
// Workspaces of a silent node UNKNOWN.
//
// Everything it knows lives in the store, so a restarted ctrl continues from
// the rows: nothing is lost and nothing runs twice.
package reconciler

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/nodepeer"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// Reconciler is ctrl's control loop and the server side of NodeService.
type Reconciler struct {
	// Store holds everything; the reconciler notifies its Notifier (topic
	// store.WorkspaceTopic) after each commit that completes a command.
	Store store.Store
	Log   *slog.Logger
	Now   func() time.Time
	// NodeGrace is how long a node may stay silent before its Workspaces
	// turn UNKNOWN.
	NodeGrace time.Duration
	// PlacementTimeout is how long a Workspace waits for a node that can
	// hold it before its command fails.
	PlacementTimeout time.Duration

	kick chan struct{}

	mu        sync.Mutex
	nodes     map[string]*nodeConn
	caps      map[string]workspace.Capacity
	templates map[string]map[string]string // node → template → version
	// quiet holds the silent nodes whose Workspaces are all marked UNKNOWN,
	// so that later passes skip them until the node connects again.
	quiet map[string]bool
}

type nodeConn struct {
	id       string
	send     chan *nodev1.ConnectResponse
	lastSeen time.Time
	sent     map[string]uint64 // workspace → generation pushed
	pool     string
	stored   time.Time // when lastSeen was last written to the store
}

var _ nodev1connect.NodeServiceHandler = (*Reconciler)(nil)

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now().UTC().Truncate(time.Microsecond)
	}
	return time.Now().UTC().Truncate(time.Microsecond)
}

func (r *Reconciler) init() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.kick == nil {
		r.kick = make(chan struct{}, 1)
		r.nodes = map[string]*nodeConn{}
		r.caps = map[string]workspace.Capacity{}
		r.templates = map[string]map[string]string{}
		r.quiet = map[string]bool{}
	}
	if r.NodeGrace == 0 {
		r.NodeGrace = 15 * time.Second
	}
	if r.PlacementTimeout == 0 {
		r.PlacementTimeout = time.Minute
	}
}

// Kick wakes the loop. An admission may have moved a Workspace of a silent
// node out of UNKNOWN, so silent nodes are checked again.
func (r *Reconciler) Kick() {
	r.init()
	r.mu.Lock()
	clear(r.quiet)
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// MaxCapacity is the capacity of the largest known node.
func (r *Reconciler) MaxCapacity() workspace.Capacity {
	r.init()
	r.mu.Lock()
	defer r.mu.Unlock()
	var best workspace.Capacity
	for _, c := range r.caps {
		if c.MemoryMiB > best.MemoryMiB {
			best = c
		}
	}
	return best
}

// Run loops until ctx is done.
func (r *Reconciler) Run(ctx context.Context) error {
	r.init()
	if err := r.loadNodes(ctx); err != nil {
		return err
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if err := r.pass(ctx); err != nil && ctx.Err() == nil {
			r.Log.Warn("reconcile pass failed", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
		case <-tick.C:
		}
	}
}

func (r *Reconciler) loadNodes(ctx context.Context) error {
	return r.Store.View(ctx, func(tx store.Tx) error {
		nodes, err := tx.ListNodes(ctx)
		if err != nil {
			return err
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, n := range nodes {
			r.caps[n.ID] = workspace.Capacity{MemoryMiB: n.MemoryMiB, CPUMillis: n.CPUMillis, StorageBytes: n.StorageBytes}
			hello := &nodev1.Hello{}
			if err := proto.Unmarshal(n.Doc, hello); err == nil {
				r.templates[n.ID] = templateMap(hello.GetTemplates())
			}
		}
		return nil
	})
}

// pass places unplaced Workspaces, pushes pending desired state and marks
// the Workspaces of silent nodes UNKNOWN.
func (r *Reconciler) pass(ctx context.Context) error {
	var pending []*store.Workspace
	if err := r.Store.View(ctx, func(tx store.Tx) error {
		var err error
		pending, err = tx.PendingWorkspaces(ctx, 500)
		return err
	}); err != nil {
		return err
	}
	for _, w := range pending {
		if w.CommandID == "" && w.NodeID == "" {
			continue // a failed placement waits for a new command
		}
		if w.NodeID == "" {
			placed, done, err := r.place(ctx, w.ID)
			if err != nil {
				return err
			}
			if done {
				r.Store.Notify(store.WorkspaceTopic(w.ID))
			}
			if placed == nil {
				continue
			}
			w = placed
		}
		r.push(w)
	}
	// Turning UNKNOWN completes no command: nobody to wake.
	_, err := r.markSilent(ctx)
	return err
}

// push sends a Workspace's desired state to its node if connected and not
// sent yet.
func (r *Reconciler) push(w *store.Workspace) {
	r.mu.Lock()
	nc := r.nodes[w.NodeID]
	if nc == nil || nc.sent[w.ID] >= w.Generation {
		r.mu.Unlock()
		return
	}
	nc.sent[w.ID] = w.Generation
	r.mu.Unlock()
	d, err := desired(w)
	if err != nil {
		r.Log.Error("encode desired state", "workspace_id", w.ID, "error", err.Error())
		return
	}
	select {
	case nc.send <- &nodev1.ConnectResponse{Desired: &nodev1.DesiredState{Workspaces: []*nodev1.DesiredWorkspace{d}}}:
	default:
		// The stream is backed up: forget it was sent, the next pass retries.
		r.mu.Lock()
		delete(nc.sent, w.ID)
		r.mu.Unlock()
	}
}

func desired(w *store.Workspace) (*nodev1.DesiredWorkspace, error) {
	pub, err := workspace.Decode(w)
	if err != nil {
		return nil, err
	}
	p := nodev1.Power_POWER_RUNNING
	switch w.Power {
	case store.PowerStopped:
		p = nodev1.Power_POWER_STOPPED
	case store.PowerDeleted:
		p = nodev1.Power_POWER_DELETED
	}
	return &nodev1.DesiredWorkspace{
		WorkspaceId: w.ID, Generation: w.Generation, Power: p, Force: w.ForceStop,
		TemplateId: pub.GetTemplate().GetTemplateId(),
		MemoryMib:  pub.GetResources().GetMemoryMib(), CpuMillis: pub.GetResources().GetCpuMillis(),
		CapacityBytes: pub.GetWritableLayer().GetCapacityBytes(),
	}, nil
}

// place chooses a node for an unplaced Workspace, or fails its command when
// none can hold it. It returns the placed row (nil when not placed) and
// whether a command completed.
func (r *Reconciler) place(ctx context.Context, id string) (*store.Workspace, bool, error) {
	completed := false
	var placed *store.Workspace
	err := r.Store.InTx(ctx, func(tx store.Tx) error {
		completed, placed = false, nil
		w, err := tx.GetWorkspace(ctx, id)
		if err != nil {
			return err
		}
		if w.NodeID != "" || w.CommandID == "" {
			return nil
		}
		pub, err := workspace.Decode(w)
		if err != nil {
			return err
		}
		now := r.now()
		if w.Power == store.PowerDeleted {
			// Never placed: nothing to release.
			pub.State, pub.DeletedAt = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED, nil
			w.DeletedAt = now
			w.ObservedGeneration = w.Generation
			if err := complete(ctx, tx, w, pub, nil, now); err != nil {
				return err
			}
			completed = true
			if err := tx.SetReferences(ctx, w.ID, nil); err != nil {
				return err
			}
			return saveRow(ctx, tx, w, pub, now)
		}
		node, reason, err := r.choose(ctx, tx, pub)
		if err != nil {
			return err
		}
		if node != "" {
			w.NodeID = node
			pub.Placement = &ctrlv1.Placement{NodeId: node, StoragePool: r.poolOf(node)}
			r.mu.Lock()
			if v := r.templates[node][pub.GetTemplate().GetTemplateId()]; v != "" && pub.GetTemplate() != nil {
				pub.Template.Version = v
			}
			r.mu.Unlock()
			placed = w
			return saveRow(ctx, tx, w, pub, now)
		}
		if now.Sub(w.UpdatedAt) < r.PlacementTimeout {
			return nil // wait for a node
		}
		fe := &fault.Error{Kind: fault.KindResourceExhausted, Reason: fault.ReasonCapacityExhausted, Stage: "placement", Message: reason}
		if reason == "" {
			fe = &fault.Error{Kind: fault.KindUnavailable, Reason: fault.ReasonNodeUnreachable, Retryable: true, Stage: "placement",
				Message: "no node is connected to place the workspace on"}
		}
		pub.State, pub.HoldsExecution = ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, false
		pub.Failure = detailOf(fe)
		w.ObservedGeneration = w.Generation
		if err := complete(ctx, tx, w, pub, fe, now); err != nil {
			return err
		}
		completed = true
		return saveRow(ctx, tx, w, pub, now)
	})
	return placed, completed, err
}

func saveRow(ctx context.Context, tx store.Tx, w *store.Workspace, pub *ctrlv1.Workspace, now time.Time) error {
	if !w.DeletedAt.IsZero() && pub.GetDeletedAt() == nil {
		pub.DeletedAt = tsOf(w.DeletedAt)
	}
	if err := workspace.Save(w, pub, now); err != nil {
		return err
	}
	return tx.UpdateWorkspace(ctx, w)
}

// choose picks the connected node with the most free memory that fits.
// reason explains a refusal when nodes exist but none fits ("" when no node
// is connected).
func (r *Reconciler) choose(ctx context.Context, tx store.Tx, pub *ctrlv1.Workspace) (string, string, error) {
	r.mu.Lock()
	type cand struct {
		id  string
		cap workspace.Capacity
	}
	var cands []cand
	tmpl := pub.GetTemplate().GetTemplateId()
	for id := range r.nodes {
		if _, ok := r.templates[id][tmpl]; ok {
			cands = append(cands, cand{id, r.caps[id]})
		}
	}
	connected := len(r.nodes)
	r.mu.Unlock()
	if connected == 0 {
		return "", "", nil
	}
	if len(cands) == 0 {
		return "", "no connected node holds template " + strconv.Quote(tmpl), nil
	}
	mem := uint64(pub.GetResources().GetMemoryMib())
	best, bestFree := "", uint64(0)
	for _, c := range cands {
		on, err := tx.WorkspacesOnNode(ctx, c.id)
		if err != nil {
			return "", "", err
		}
		var used uint64
		for _, o := range on {
			if o.Power == store.PowerRunning {
				op, err := workspace.Decode(o)
				if err != nil {
					return "", "", err
				}
				used += uint64(op.GetResources().GetMemoryMib())
			}
		}
		if used+mem <= c.cap.MemoryMiB && uint64(pub.GetResources().GetCpuMillis()) <= c.cap.CPUMillis {
			if free := c.cap.MemoryMiB - used; best == "" || free > bestFree {
				best, bestFree = c.id, free
			}
		}
	}
	if best == "" {
		return "", "no connected node has the memory and CPU this workspace requests", nil
	}
	return best, "", nil
}

func (r *Reconciler) poolOf(node string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if nc := r.nodes[node]; nc != nil {
		return nc.pool
	}
	return ""
}

// markSilent turns the Workspaces of nodes silent beyond the grace UNKNOWN.
func (r *Reconciler) markSilent(ctx context.Context) (int, error) {
	now := r.now()
	r.mu.Lock()
	var silent []string
	for id := range r.caps {
		nc := r.nodes[id]
		if (nc == nil || now.Sub(nc.lastSeen) > r.NodeGrace) && !r.quiet[id] {
			silent = append(silent, id)
		}
	}
	r.mu.Unlock()
	n := 0
	for _, id := range silent {
		quiet := false
		err := r.Store.InTx(ctx, func(tx store.Tx) error {
			quiet = false
			node, err := tx.GetNode(ctx, id)
			if err != nil {
				return err
			}
			if now.Sub(node.LastSeen) <= r.NodeGrace {
				return nil // another replica hears from it
			}
			quiet = true
			on, err := tx.WorkspacesOnNode(ctx, id)
			if err != nil {
				return err
			}
			for _, w := range on {
				if w.State == int32(ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN) || w.State == int32(ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED) {
					continue
				}
				pub, err := workspace.Decode(w)
				if err != nil {
					return err
				}
				pub.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN
				if err := saveRow(ctx, tx, w, pub, now); err != nil {
					return err
				}
				n++
			}
			return nil
		})
		if err != nil {
			return n, err
		}
		if quiet {
			r.mu.Lock()
			if nc := r.nodes[id]; nc == nil || now.Sub(nc.lastSeen) > r.NodeGrace {
				r.quiet[id] = true
			}
			r.mu.Unlock()
		}
	}
	return n, nil
}

// Connect serves one node's stream.
func (r *Reconciler) Connect(ctx context.Context, stream *connect.BidiStream[nodev1.ConnectRequest, nodev1.ConnectResponse]) error {
	r.init()
	first, err := stream.Receive()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil || hello.GetNodeId() == "" {
		return fault.Invalid("hello", "the stream must open with a Hello naming the node")
	}
	id := hello.GetNodeId()
	peer, hasPeer := nodepeer.From(ctx)
	if hasPeer && peer.NodeID != id {
		return &fault.Error{Kind: fault.KindPermissionDenied, Reason: fault.ReasonPermissionDenied,
			Message: "the node certificate does not name node " + id}
	}
	now := r.now()
	c := hello.GetCapacity()
	if err := r.Store.InTx(ctx, func(tx store.Tx) error {
		n, err := tx.GetNode(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			n = &store.Node{ID: id, CreatedAt: now}
		} else if err != nil {
			return err
		}
		// After an enrollment only its certificate's key may speak for the
		// node: re-enrolling a node ID shuts out the machine it replaced.
		if hasPeer {
			if err := peer.MayConnect(n.CertKeyHash); err != nil {
				return err
			}
		}
		n.LastSeen, n.MemoryMiB, n.CPUMillis, n.StorageBytes = now, c.GetMemoryMib(), c.GetCpuMillis(), c.GetStorageBytes()
		if n.Doc, err = proto.Marshal(&nodev1.Hello{NodeId: id, Capacity: c, Templates: hello.GetTemplates()}); err != nil {
			return err
		}
		return tx.UpsertNode(ctx, n)
	}); err != nil {
		return err
	}
	nc := &nodeConn{id: id, send: make(chan *nodev1.ConnectResponse, 256), lastSeen: time.Now(), sent: map[string]uint64{}, pool: c.GetStoragePool()}
	r.mu.Lock()
	if old := r.nodes[id]; old != nil {
		close(old.send) // a newer stream replaces the old one
	}
	r.nodes[id] = nc
	r.caps[id] = workspace.Capacity{MemoryMiB: c.GetMemoryMib(), CPUMillis: c.GetCpuMillis(), StorageBytes: c.GetStorageBytes()}
	r.templates[id] = templateMap(hello.GetTemplates())
	delete(r.quiet, id)
	r.mu.Unlock()
	r.Log.Info("node connected", "node_id", id, "executions", len(hello.GetExecutions()))
	defer func() {
		r.mu.Lock()
		if r.nodes[id] == nc {
			delete(r.nodes, id)
		}
		r.mu.Unlock()
		r.Log.Info("node disconnected", "node_id", id)
	}()

	for _, rep := range hello.GetExecutions() {
		r.report(ctx, id, rep)
	}
	// Full desired state, then changes.
	full, err := r.fullState(ctx, nc)
	if err != nil {
		return err
	}
	if err := stream.Send(full); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		for {
			msg, err := stream.Receive()
			if err != nil {
				errc <- err
				return
			}
			r.mu.Lock()
			nc.lastSeen = time.Now()
			r.mu.Unlock()
			switch b := msg.GetBody().(type) {
			case *nodev1.ConnectRequest_Report:
				r.report(ctx, id, b.Report)
			case *nodev1.ConnectRequest_Heartbeat:
				r.heartbeat(ctx, id)
			}
		}
	}()
	r.Kick()
	for {
		select {
		case msg, ok := <-nc.send:
			if !ok {
				return nil
			}
			if err := stream.Send(msg); err != nil {
				return err
			}
		case err := <-errc:
			return err
		case <-ctx.Done():
			return nil
		}
	}
}

func (r *Reconciler) report(ctx context.Context, node string, rep *nodev1.ExecutionReport) {
	done, err := r.applyReport(ctx, node, rep)
	if err != nil {
		r.Log.Error("apply report", "node_id", node, "workspace_id", rep.GetWorkspaceId(), "error", err.Error())
		return
	}
	if done {
		// Before anything else: waiters return as soon as the commit has.
		r.Store.Notify(store.WorkspaceTopic(rep.GetWorkspaceId()))
	}
	r.heartbeat(ctx, node)
	r.Kick()
}

// heartbeat records that a node is alive; the store's last_seen is what
// other replicas and restarts see.
func (r *Reconciler) heartbeat(ctx context.Context, node string) {
	now := r.now()
	r.mu.Lock()
	nc := r.nodes[node]
	if nc != nil {
		if now.Sub(nc.stored) < time.Second {
			r.mu.Unlock()
			return // written less than a second ago: no transaction
		}
		nc.stored = now
	}
	r.mu.Unlock()
	err := r.Store.InTx(ctx, func(tx store.Tx) error {
		n, err := tx.GetNode(ctx, node)
		if err != nil {
			return err
		}
		if now.Sub(n.LastSeen) < time.Second {
			return nil
		}
		n.LastSeen = now
		return tx.UpsertNode(ctx, n)
	})
	if err != nil && ctx.Err() == nil {
		r.Log.Warn("record heartbeat", "node_id", node, "error", err.Error())
	}
}

func (r *Reconciler) fullState(ctx context.Context, nc *nodeConn) (*nodev1.ConnectResponse, error) {
	var on []*store.Workspace
	if err := r.Store.View(ctx, func(tx store.Tx) error {
		var err error
		on, err = tx.WorkspacesOnNode(ctx, nc.id)
		return err
	}); err != nil {
		return nil, err
	}
	out := &nodev1.DesiredState{Full: true}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range on {
		d, err := desired(w)
		if err != nil {
			return nil, err
		}
		out.Workspaces = append(out.Workspaces, d)
		nc.sent[w.ID] = w.Generation
	}
	return &nodev1.ConnectResponse{Desired: out}, nil
}

// Template resolves a template ID to the version a node holds ("" when only
// the built-in default is known and no node reported it yet). ok is false
// for a template no node has reported.
func (r *Reconciler) Template(id string) (version string, ok bool) {
	r.init()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.templates {
		if v, found := m[id]; found {
			return v, true
		}
	}
	return "", id == workspace.DefaultTemplate
}

func templateMap(list []*nodev1.TemplateInfo) map[string]string {
	m := make(map[string]string, len(list))
	for _, t := range list {
		m[t.GetTemplateId()] = t.GetVersion()
	}
	return m
}
