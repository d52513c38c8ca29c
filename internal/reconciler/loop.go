package reconciler

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// Run loops until ctx is done.
func (r *Reconciler) Run(ctx context.Context) error {
	if err := r.loadNodes(ctx); err != nil {
		return err
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if err := r.pass(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("reconcile pass failed", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
		case <-tick.C:
		}
	}
}

// loadNodes learns the nodes the store knows, connected or not, so that a
// restarted ctrl judges their silence and their capacity.
func (r *Reconciler) loadNodes(ctx context.Context) error {
	return r.store.View(ctx, func(tx store.Tx) error {
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
	if err := r.store.View(ctx, func(tx store.Tx) error {
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
				r.store.Notify(store.WorkspaceTopic(w.ID))
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
		r.log.Error("encode desired state", "workspace_id", w.ID, "error", err.Error())
		return
	}
	r.offer(nc, w.ID, &nodev1.ConnectResponse{Desired: &nodev1.DesiredState{Workspaces: []*nodev1.DesiredWorkspace{d}}})
}

// offer queues msg, the desired state of workspace id, on nc's stream. A
// stream that is backed up forgets it was sent, so the next pass retries;
// one that was replaced meanwhile never sends it, and the new stream starts
// with the full state.
func (r *Reconciler) offer(nc *nodeConn, id string, msg *nodev1.ConnectResponse) {
	select {
	case nc.send <- msg:
	default:
		r.mu.Lock()
		delete(nc.sent, id)
		r.mu.Unlock()
	}
}

// desired is the desired state of a Workspace as its node receives it.
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

// silent reports whether a node has been silent beyond the grace at now: a
// known node that is not connected, or whose last message is older.
// Callers hold r.mu.
func (r *Reconciler) silent(id string, now time.Time) bool {
	nc := r.nodes[id]
	return nc == nil || now.Sub(nc.lastSeen) > r.nodeGrace
}

// markSilent turns the Workspaces of nodes silent beyond the grace UNKNOWN.
// It returns how many Workspaces it turned.
func (r *Reconciler) markSilent(ctx context.Context) (int, error) {
	now := r.now()
	r.mu.Lock()
	var silent []string
	for id := range r.caps {
		if r.silent(id, now) && !r.quiet[id] {
			silent = append(silent, id)
		}
	}
	r.mu.Unlock()
	n := 0
	for _, id := range silent {
		quiet := false
		err := r.store.InTx(ctx, func(tx store.Tx) error {
			quiet = false
			node, err := tx.GetNode(ctx, id)
			if err != nil {
				return err
			}
			if now.Sub(node.LastSeen) <= r.nodeGrace {
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
			if r.silent(id, now) {
				r.quiet[id] = true
			}
			r.mu.Unlock()
		}
	}
	return n, nil
}
