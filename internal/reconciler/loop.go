package reconciler

import (
	"context"
	"errors"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/lease"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// Run loops until ctx is done. Its first loads of the node and fleet
// records are tried again every second until they succeed: a store that
// cannot serve at start-up (the database restarting) delays the loop, it
// does not end it.
func (r *Reconciler) Run(ctx context.Context) error {
	changed, release := r.subscribeNodes() // before the first load: nothing missed
	for {
		err := r.loadNodes(ctx)
		if err == nil {
			err = r.loadFleet(ctx)
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			release()
			return nil
		}
		r.log.Warn("load node and fleet records; trying again in 1 s", "error", err.Error())
		select {
		case <-ctx.Done():
			release()
			return nil
		case <-time.After(time.Second):
		}
	}
	go r.wakeOnNotify(ctx)
	go r.wakeOnNodes(ctx, changed, release)
	go r.writeSeenEvery(ctx)
	go r.reloadEvery(ctx)
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

// pass stops what the drains with stop_workspaces stop (drain.go), places
// unplaced Workspaces, pushes pending desired state and marks the
// Workspaces of silent nodes UNKNOWN.
//
// With several replicas, the fleet-wide work is done only by the holder
// of the fleet lease (Config.Leader, asked before each unit of it): the
// drain rule, failing a placement at its timeout, and silent-node
// detection. Placing a Workspace is, for handoff after its admission, the
// work of the replica that admitted it (Admitted), then the lease
// holder's; either places it on the nodes connected to any replica. Every
// replica pushes the desired state of the Workspaces placed on the nodes
// whose streams it holds; after a placement on a node connected to
// another replica, the placer notifies store.PushTopic, and that
// replica's next pass pushes it. (When every replica placed every pending
// Workspace on its own nodes, two replicas' placement transactions held
// the same rows and PostgreSQL aborted one of them again and again:
// bench/results/2026-12-02-hollow-queue.md.)
func (r *Reconciler) pass(ctx context.Context) error {
	tr := newPassTrace(ctx, r.log)
	defer tr.log(ctx, r.log)
	r.refresh(ctx, false) // what a notification marked stale; reloadEvery reloads the rest
	tr.mark("refresh")
	// Before the pending Workspaces are read: the stops it starts are sent
	// in this pass.
	if r.leads() { // else the fleet lease's holder applies the rules
		if err := r.drainRules(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("apply the stop_workspaces rule of draining nodes", "error", err.Error())
		}
		tr.mark("drain")
	}
	var pending []*store.Workspace
	if err := r.store.View(ctx, func(tx store.Tx) error {
		var err error
		pending, err = tx.PendingWorkspaces(ctx, 500)
		return err
	}); err != nil {
		return err
	}
	tr.mark("pending")
	// What was placed before an error is pushed all the same, now, not at
	// the next pass.
	ready, err := r.placePending(ctx, pending, tr)
	r.pushLogged(ctx, ready)
	tr.mark("place_push")
	if err != nil {
		return err
	}
	if err := r.pushVolumes(ctx); err != nil && ctx.Err() == nil {
		r.log.Warn("push desired volumes", "error", err.Error())
	}
	r.flushPending()
	tr.mark("volumes")
	// Turning UNKNOWN completes no command: nobody to wake.
	if !r.leads() {
		r.mu.Lock()
		r.judging = time.Time{} // judged again from when it holds the lease
		r.mu.Unlock()
		return nil // the fleet lease's holder judges silence
	}
	_, err = r.markSilent(ctx)
	tr.mark("silent")
	return err
}

// refresh reloads the node and fleet records that are stale or were
// never loaded and, when aged, those older than their bounds (refreshNodes,
// refreshFleet). A failure is logged: the records learnt so far stay,
// placement goes on with them, and the next refresh reloads.
func (r *Reconciler) refresh(ctx context.Context, aged bool) {
	if err := r.refreshNodes(ctx, aged, r.leads()); err != nil && ctx.Err() == nil {
		r.log.Warn("reload node records", "error", err.Error())
	}
	if err := r.refreshFleet(ctx, aged); err != nil && ctx.Err() == nil {
		r.log.Warn("reload fleet records", "error", err.Error())
	}
}

// reloadEvery reloads, every reloadTick until ctx is done, the node and
// fleet records older than their bounds (refresh), and the usage cache
// placement weighs nodes by (refreshUsage): off the passes, so that the
// pass placing the Workspace a client waits for does not wait for a
// periodic reload too. With 1,000 nodes one took 4–8 ms at p50 and 40 ms
// at p90 when two replicas shared two cores, once a second in the passes
// (bench/results/2026-12-03-reload-off-pass.md). A pass reloads only what
// a notification marked stale.
func (r *Reconciler) reloadEvery(ctx context.Context) {
	every(ctx, reloadTick, func() {
		r.refresh(ctx, true)
		r.refreshUsage(ctx)
	})
}

// every runs fn every d until ctx is done, one run at a time.
func every(ctx context.Context, d time.Duration, fn func()) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			fn()
		}
	}
}

// reloadTick is how often reloadEvery looks at the records' ages: a
// record is reloaded at most reloadTick after its bound.
const reloadTick = 250 * time.Millisecond

// placePending places the unplaced Workspaces of pending that are this
// replica's to place (placer), pushChunk to a transaction (placeEach), and
// pushes the placed ones, those pending placed before and those it
// placed, pushChunk at a time. It returns the placed ones it has not
// pushed yet, also when it fails: the caller pushes them. When it placed
// one on a node whose stream another replica holds, it wakes the other
// replicas (store.PushTopic) to push it, as soon as that chunk committed.
func (r *Reconciler) placePending(ctx context.Context, pending []*store.Workspace, tr *passTrace) ([]*store.Workspace, error) {
	var batch []string           // unplaced: placed together
	var ready []*store.Workspace // placed: pushed together
	mine := r.placer()
	var nodes []candidate // reachable, read once for the pass's batches
	placeAll := func() error {
		if nodes == nil {
			nodes = r.reachable(r.now())
		}
		ps, err := r.placeEach(ctx, nodes, batch, tr)
		elsewhere := false
		for i, p := range ps {
			if p.completed {
				r.store.Notify(store.WorkspaceTopic(batch[i]))
			}
			if p.placed != nil {
				ready = append(ready, p.placed)
				elsewhere = elsewhere || !r.holds(p.placed.NodeID)
			}
		}
		if elsewhere {
			r.store.Notify(store.PushTopic)
		}
		batch = batch[:0]
		return err
	}
	for _, w := range pending {
		if w.CommandID == "" && w.NodeID == "" {
			continue // a failed placement waits for a new command
		}
		if w.NodeID == "" && !mine(w) {
			continue // the replica that admitted it places it, for now
		}
		if refused, err := r.refuseOversized(ctx, w); err != nil {
			return ready, err
		} else if refused {
			continue // beyond its node: the start failed (resources.go)
		}
		if w.NodeID != "" {
			ready = append(ready, w)
		} else if batch = append(batch, w.ID); len(batch) == pushChunk {
			if err := placeAll(); err != nil {
				return ready, err
			}
		}
		if len(ready) >= pushChunk {
			r.pushLogged(ctx, ready)
			ready = ready[:0]
		}
	}
	if len(batch) > 0 {
		return ready, placeAll()
	}
	return ready, nil
}

// pushChunk is how many Workspaces a pass places in one transaction
// (placeBatch), and how many placed it gathers before it pushes them: a
// pass may place hundreds, and the first ones must not wait for the last
// (bench/hollow saw creates reach their nodes in bursts of the whole
// pass, 10 s apart, when the push came after every placement of it).
const pushChunk = 32

// placeEach places ids in one transaction (placeBatch). When that fails
// for another reason than the store, it places them one by one, so that
// one Workspace that cannot be placed (a row that does not decode) does
// not hold back the others: each failure is logged, and the pass fails
// only when every one of them did.
func (r *Reconciler) placeEach(ctx context.Context, nodes []candidate, ids []string, tr *passTrace) ([]placement, error) {
	out, err := r.placeBatch(ctx, nodes, ids, tr)
	if err == nil || len(ids) == 1 || ctx.Err() != nil || fault.KindOf(err) == fault.KindUnavailable {
		return out, err
	}
	out = make([]placement, len(ids))
	failed := 0
	for i, id := range ids {
		placed, completed, perr := r.place(ctx, nodes, id)
		switch {
		case errors.Is(perr, lease.ErrNotHeld):
			// The fleet lease moved on: its holder fails it.
		case perr != nil:
			failed++
			err = perr
			r.log.Warn("place workspace", "workspace_id", id, "error", perr.Error())
		default:
			out[i] = placement{placed: placed, completed: completed}
		}
	}
	if failed < len(ids) {
		err = nil
	}
	return out, err
}

// pushLogged pushes ws (push), logging a failure: the next pass retries.
func (r *Reconciler) pushLogged(ctx context.Context, ws []*store.Workspace) {
	if len(ws) == 0 {
		return
	}
	if err := r.push(ctx, ws); err != nil && ctx.Err() == nil {
		r.log.Warn("push desired state", "error", err.Error())
	}
}

// push sends the desired state of each Workspace of ws to its node, when
// connected and not sent yet. The states are built in one store view (the
// network configurations read the Egresses and Resolvers they reference,
// each once); when the view fails, none counts as sent and the next pass
// retries.
func (r *Reconciler) push(ctx context.Context, ws []*store.Workspace) error {
	type job struct {
		nc *nodeConn
		w  *store.Workspace
	}
	var jobs []job
	r.mu.Lock()
	for _, w := range ws {
		nc := r.nodes[w.NodeID]
		if nc == nil || nc.sent[w.ID] >= w.Generation {
			continue
		}
		nc.sent[w.ID] = w.Generation
		jobs = append(jobs, job{nc, w})
	}
	r.mu.Unlock()
	if len(jobs) == 0 {
		return nil
	}
	msgs := make([]*nodev1.DesiredWorkspace, len(jobs))
	vols := make([]*nodev1.DesiredVolume, len(jobs)) // each Workspace's Volume, sent with it
	err := r.store.View(ctx, func(tx store.Tx) error {
		nr := newNetReader(ctx, tx, r.log)
		for i, j := range jobs {
			var err error
			if vols[i], err = boundVolume(ctx, tx, j.w); err != nil {
				return err
			}
			d, err := nr.desired(j.w)
			var de *decodeError
			switch {
			case errors.As(err, &de):
				// A row that does not decode stays counted as sent: pushing
				// it again would fail the same way.
				r.log.Error("encode desired state", "workspace_id", j.w.ID, "error", err.Error())
			case err != nil:
				return err
			}
			msgs[i] = d
		}
		return nil
	})
	if err != nil {
		r.mu.Lock()
		for _, j := range jobs {
			if j.nc.sent[j.w.ID] == j.w.Generation {
				delete(j.nc.sent, j.w.ID)
			}
		}
		r.mu.Unlock()
		return err
	}
	for i, j := range jobs {
		if msgs[i] != nil {
			ds := &nodev1.DesiredState{Workspaces: []*nodev1.DesiredWorkspace{msgs[i]}}
			if vols[i] != nil {
				ds.Volumes = []*nodev1.DesiredVolume{vols[i]}
			}
			r.offer(j.nc, j.w.ID, &nodev1.ConnectResponse{Desired: ds})
		}
	}
	return nil
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

// decodeError is a Workspace row whose document does not decode.
type decodeError struct{ err error }

func (e *decodeError) Error() string { return e.err.Error() }
func (e *decodeError) Unwrap() error { return e.err }

// desired is the desired state of a Workspace as its node receives it, its
// network configuration included (networkConfig). A row that does not
// decode is a *decodeError; any other error is the store's.
func (n *netReader) desired(w *store.Workspace) (*nodev1.DesiredWorkspace, error) {
	pub, err := workspace.Decode(w)
	if err != nil {
		return nil, &decodeError{err}
	}
	network, err := n.networkConfig(w, pub)
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
	d := &nodev1.DesiredWorkspace{
		WorkspaceId: w.ID, Generation: w.Generation, Power: p, Force: w.ForceStop,
		TemplateId: pub.GetTemplate().GetTemplateId(),
		MemoryMib:  pub.GetResources().GetMemoryMib(), CpuMillis: pub.GetResources().GetCpuMillis(),
		CapacityBytes: pub.GetWritableLayer().GetCapacityBytes(),
		Network:       network,
		Volume:        workspaceVolume(pub),
	}
	return d, n.template(d, pub)
}

// silent reports whether a node has been silent beyond the grace at now:
// neither the store's last_seen (written by whichever replica holds its
// stream, as of the last reload of the node records) nor this ctrl's
// stream heard from it within the grace, nor did the grace pass since
// this ctrl began judging (Reconciler.judging). Callers hold r.mu.
func (r *Reconciler) silent(id string, now time.Time) bool {
	seen := r.storeSeen(id)
	if r.judging.After(seen) {
		seen = r.judging
	}
	return now.Sub(seen) > r.nodeGrace
}

// markSilent turns the Workspaces of nodes silent beyond the grace UNKNOWN,
// and the network_policy_status of those desired RUNNING UNKNOWN too. It
// returns how many Workspaces it turned. Every node of the store is judged,
// by the last_seen the node records' reload read (one query for all nodes,
// at most silenceReload old on the fleet lease's holder); only a node
// silent by it costs a transaction, which reads its last_seen again, and
// checks the fleet lease (Config.Fence) before it writes.
func (r *Reconciler) markSilent(ctx context.Context) (int, error) {
	now := r.now()
	r.mu.Lock()
	if r.judging.IsZero() {
		r.judging = now // it took the fleet lease
	}
	var silent []string
	view := r.fleetView()
	for id := range r.stored {
		// A RETIRED node holds no Workspace: nothing to mark, ever.
		if r.silent(id, now) && !r.quiet[id] && view.State(id) != fleet.StateRetired {
			silent = append(silent, id)
		}
	}
	r.mu.Unlock()
	n := 0
	for _, id := range silent {
		if !r.leads() {
			break // the fleet lease moved on
		}
		quiet := false
		marked := 0
		err := r.store.InTx(ctx, func(tx store.Tx) error {
			quiet, marked = false, 0
			node, err := tx.GetNode(ctx, id)
			if err != nil {
				return err
			}
			if now.Sub(node.LastSeen) <= r.nodeGrace {
				return nil // another replica hears from it
			}
			if err := r.fenced(ctx, tx); err != nil {
				return err
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
				// Nobody confirms the running execution's network either,
				// until the node reports again.
				if w.Power == store.PowerRunning && pub.GetNetworkPolicyStatus() != nil {
					pub.NetworkPolicyStatus.State = ctrlv1.NetworkPolicyState_NETWORK_POLICY_STATE_UNKNOWN
				}
				if err := saveRow(ctx, tx, w, pub, now); err != nil {
					return err
				}
				marked++
			}
			return nil
		})
		if errors.Is(err, lease.ErrNotHeld) {
			break // the fleet lease moved on: nothing of this unit committed
		}
		if err != nil {
			return n, err
		}
		n += marked
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

// placer returns which unplaced Workspaces this replica places now: those
// it admitted within handoff (Admitted), and, when it holds the fleet
// lease, those admitted handoff or more ago, by any replica; every one
// without Config.Leader (one ctrl). It forgets the Workspaces it admitted
// handoff or more ago.
func (r *Reconciler) placer() func(w *store.Workspace) bool {
	if r.leader == nil {
		return func(*store.Workspace) bool { return true }
	}
	leads, now := r.leads(), r.now()
	r.mu.Lock()
	mine := make(map[string]bool, len(r.admitted))
	for id, at := range r.admitted {
		if time.Since(at) >= handoff {
			delete(r.admitted, id)
		} else {
			mine[id] = true
		}
	}
	r.mu.Unlock()
	return func(w *store.Workspace) bool {
		return mine[w.ID] || (leads && now.Sub(w.UpdatedAt) >= handoff)
	}
}

// holds reports whether this ctrl holds node's stream.
func (r *Reconciler) holds(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nodes[node] != nil
}
