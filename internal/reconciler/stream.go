package reconciler

import (
	"context"
	"errors"
	"io"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/artifact"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/nodepeer"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/tunnel"
	"github.com/kibotos/kibotos/internal/workspace"
)

// MaxNodeMessageBytes bounds every message of a NodeService stream, in each
// direction (nodewire.MaxMessageBytes, the node's bound too).
const MaxNodeMessageBytes = nodewire.MaxMessageBytes

// Connect serves one node's stream: a Hello first (recorded in the store,
// its executions folded in as reports), then the node's full desired state,
// then changes one way and reports and heartbeats the other. The caller
// must be a verified node certificate (nodepeer) that names the Hello's
// node, whose key is not denied and is the key of the node's latest
// enrollment.
func (r *Reconciler) Connect(ctx context.Context, stream *connect.BidiStream[nodev1.ConnectRequest, nodev1.ConnectResponse]) error {
	peer, hasPeer := nodepeer.From(ctx)
	if !hasPeer {
		return &fault.Error{Kind: fault.KindPermissionDenied, Reason: fault.ReasonPermissionDenied,
			Message: "NodeService needs a node certificate"}
	}
	first, err := stream.Receive()
	if err != nil {
		return streamEnded(err)
	}
	hello := first.GetHello()
	if hello == nil || hello.GetNodeId() == "" {
		return fault.Invalid("hello", "the stream must open with a Hello naming the node")
	}
	id := hello.GetNodeId()
	r.checkHello(hello)
	if peer.NodeID != id {
		return &fault.Error{Kind: fault.KindPermissionDenied, Reason: fault.ReasonPermissionDenied,
			Message: "the node certificate does not name the node of the Hello"}
	}
	if err := r.registerKey(ctx, hello, peer.KeyHash, func(tx store.NodeTx, n *store.Node) error {
		// A denied key never connects; after an enrollment only its
		// certificate's key may speak for the node: re-enrolling a node ID
		// shuts out the machine it replaced.
		return peer.Admit(ctx, tx, n)
	}); err != nil {
		return err
	}
	nc := r.attach(hello, peer.KeyHash)
	r.log.Info("node connected", "node_id", id, "executions", len(hello.GetExecutions()))
	defer func() {
		r.detach(nc)
		r.log.Info("node disconnected", "node_id", id)
	}()

	full, err := r.resync(ctx, nc, hello)
	if err != nil {
		return err
	}
	// Full desired state, then changes.
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
			if r.superseded(nc) {
				// A newer connection of the node registered (the records'
				// reload saw its epoch): nothing of this stream is applied.
				r.supersede(nc)
				continue
			}
			r.seen(nc)
			switch b := msg.GetBody().(type) {
			case *nodev1.ConnectRequest_Report:
				r.reportLost(ctx, nc, r.report(ctx, nc, b.Report))
			case *nodev1.ConnectRequest_Heartbeat:
				r.memoryCondition(ctx, id, b.Heartbeat.GetMemory())
			case *nodev1.ConnectRequest_VolumeReport:
				r.reportLost(ctx, nc, r.volumeReport(ctx, id, b.VolumeReport))
			case *nodev1.ConnectRequest_Inventory:
				r.inventory(ctx, nc, b.Inventory)
			}
		}
	}()
	r.wake()
	// A denial of the stream's key on another replica (DenyNodeKey,
	// RetireNode there) ends it here too: that replica notifies the key's
	// topic, and the denial is read from the store.
	keyCh, releaseKey := r.store.Subscribe(tunnel.KeyTopic(peer.KeyHash))
	defer func() { releaseKey() }()
	for {
		select {
		case <-keyCh:
			releaseKey()
			keyCh, releaseKey = r.store.Subscribe(tunnel.KeyTopic(peer.KeyHash))
			if denied, err := r.keyDenied(ctx, peer.KeyHash); err == nil && denied {
				r.log.Warn("node stream ended: its key was denied", "node_id", id)
				return &fault.Error{Kind: fault.KindPermissionDenied, Reason: fault.ReasonPermissionDenied,
					Message: "the node certificate's key is denied"}
			}
		case <-nc.replaced:
			r.mu.Lock()
			err := nc.endErr
			r.mu.Unlock()
			return err
		case msg := <-nc.send:
			if err := stream.Send(msg); err != nil {
				return err
			}
		case err := <-errc:
			return streamEnded(err)
		case <-ctx.Done():
			return nil
		}
	}
}

// streamEnded is what Connect answers when receiving from its node failed
// with err: nothing when the node ended the stream or its connection (an
// EOF, which connect-go may wrap as CodeUnknown): that is a node going
// away, not a fault of ctrl's to log as internal.
func streamEnded(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil
	}
	return err
}

// FetchArtifact streams a published artifact's bytes to a node: the caller
// must be a verified node certificate whose key is not denied.
func (r *Reconciler) FetchArtifact(ctx context.Context, req *connect.Request[nodev1.FetchArtifactRequest], stream *connect.ServerStream[nodev1.FetchArtifactResponse]) error {
	peer, ok := nodepeer.From(ctx)
	if !ok {
		return &fault.Error{Kind: fault.KindPermissionDenied, Reason: fault.ReasonPermissionDenied,
			Message: "NodeService needs a node certificate"}
	}
	if err := r.store.InTx(ctx, func(tx store.Tx) error {
		n, err := tx.GetNode(ctx, peer.NodeID)
		if err != nil {
			return err
		}
		return peer.Admit(ctx, tx, n)
	}); err != nil {
		return err
	}
	if r.fetchArtifact == nil {
		return &fault.Error{Kind: fault.KindUnimplemented, Reason: fault.ReasonCapabilityUnavailable,
			Message: "this ctrl does not serve artifacts"}
	}
	return r.fetchArtifact(ctx, req.Msg, stream.Send)
}

// register is registerKey without a key (tests).
func (r *Reconciler) register(ctx context.Context, hello *nodev1.Hello, mayConnect func(store.NodeTx, *store.Node) error) error {
	return r.registerKey(ctx, hello, nil, mayConnect)
}

// registerKey records a Hello in the store: the node (created on its first
// Hello), its capacity and templates, that it was seen now and its next
// connection epoch (store.Node.Epoch, which attach gives the stream); and its
// fleet record (fleet.Register: created ACTIVE at registration version 1
// on the first Hello, the key keyHash it spoke with recorded). mayConnect
// vets the stored node first; a RETIRED node is refused
// (failed_precondition), nothing written.
func (r *Reconciler) registerKey(ctx context.Context, hello *nodev1.Hello, keyHash []byte, mayConnect func(store.NodeTx, *store.Node) error) error {
	id, c, now := hello.GetNodeId(), hello.GetCapacity(), r.now()
	created := false
	var epoch int64
	err := r.store.InTx(ctx, func(tx store.Tx) error {
		created, epoch = false, 0
		n, err := tx.GetNode(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			n = &store.Node{ID: id, CreatedAt: now}
		} else if err != nil {
			return err
		}
		if err := mayConnect(tx, n); err != nil {
			return err
		}
		_, _, err = fleet.GetRecord(ctx, tx, id)
		created = errors.Is(err, store.ErrNotFound)
		if err != nil && !created {
			return err
		}
		if _, err := fleet.Register(ctx, tx, id, keyHash, false, now); err != nil {
			return err
		}
		// A new connection epoch: the writes of the node's older streams,
		// on any replica, are refused from now on.
		n.Epoch++
		epoch = n.Epoch
		n.LastSeen, n.MemoryMiB, n.CPUMillis, n.StorageBytes = now, c.GetMemoryMib(), c.GetCpuMillis(), c.GetStorageBytes()
		if n.Doc, err = proto.Marshal(&nodev1.Hello{NodeId: id, Capacity: c, Templates: hello.GetTemplates(),
			Features: hello.GetFeatures(), Platforms: hello.GetPlatforms(), GuestProtocolVersion: hello.GetGuestProtocolVersion()}); err != nil {
			return err
		}
		return tx.UpsertNode(ctx, n)
	})
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.registered[id] = epoch
	if created {
		// A new record: the cached view learns it (ACTIVE either way).
		r.fleet.stale = true
	}
	r.mu.Unlock()
	// Every replica learns the node's record (nodes.go).
	r.nodesChangedHere()
	return nil
}

// attach makes a Hello's node the connected one of its ID, seen now; a
// newer stream replaces an older one. keyHash is the key of the certificate
// the stream came with.
func (r *Reconciler) attach(hello *nodev1.Hello, keyHash []byte) *nodeConn {
	id, c, now := hello.GetNodeId(), hello.GetCapacity(), r.now()
	nc := &nodeConn{id: id, send: make(chan *nodev1.ConnectResponse, 256), replaced: make(chan struct{}),
		lastSeen: now, stored: now, sent: map[string]uint64{}, volSent: map[string]uint64{}, pool: c.GetStoragePool(), keyHash: keyHash}
	r.mu.Lock()
	defer r.mu.Unlock()
	nc.epoch = r.registered[id] // the epoch of the registration just committed
	k := r.stored[id]
	k.epoch, k.pool = nc.epoch, nc.pool
	if k.lastSeen.Before(now) {
		k.lastSeen = now
	}
	r.stored[id] = k
	if old := r.nodes[id]; old != nil {
		old.end(nil) // a newer stream replaces the old one
	}
	r.nodes[id] = nc
	r.caps[id] = workspace.Capacity{MemoryMiB: c.GetMemoryMib(), CPUMillis: c.GetCpuMillis(), StorageBytes: c.GetStorageBytes()}
	r.templates[id] = templateMap(hello.GetTemplates())
	r.features[id] = featureSet(hello.GetFeatures())
	r.agentRatio[id] = c.GetMemoryOvercommitRatio()
	delete(r.quiet, id)
	return nc
}

// DenyNodeKey revokes a node certificate key: from now on NodeService
// refuses its connections, CertificateService its renewals and
// BootstrapService re-enrollments with it, whatever certificate carries it
// (store.DeniedNodeKey). A stream this ctrl holds with that key ends at
// once, and so do the data tunnels opened with it (EndKey); a stream
// another replica holds ends there at the key's notification
// (tunnel.KeyTopic, which EndKey's hook notifies). Denying a denied
// key again changes nothing. RetireNode denies in its own transaction and
// then calls EndKey.
func (r *Reconciler) DenyNodeKey(ctx context.Context, nodeID string, keyHash []byte, reason string) error {
	if len(keyHash) != 32 {
		return fault.Invalid("key_hash", "a node key hash is a SHA-256 (32 bytes), not %d bytes", len(keyHash))
	}
	now := r.now()
	if err := r.store.InTx(ctx, func(tx store.Tx) error {
		return tx.DenyNodeKey(ctx, &store.DeniedNodeKey{KeyHash: keyHash, NodeID: nodeID, DeniedAt: now, Reason: reason})
	}); err != nil {
		return err
	}
	r.log.Warn("node key denied", "node_id", nodeID, "reason", reason)
	r.EndKey(keyHash)
	return nil
}

// detach forgets a stream that ended, unless a newer one replaced it. The
// node stays known (capacity, templates), so its silence is judged.
func (r *Reconciler) detach(nc *nodeConn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodes[nc.id] == nc {
		delete(r.nodes, nc.id)
		k := r.stored[nc.id]
		k.ended = nc.epoch
		r.stored[nc.id] = k
	}
}

// seen records that a message arrived on nc.
func (r *Reconciler) seen(nc *nodeConn) {
	now := r.now()
	r.mu.Lock()
	nc.lastSeen = now
	delete(r.quiet, nc.id) // heard again: judged again when silent
	r.mu.Unlock()
}

// errSuperseded is the refusal of a report whose stream a newer
// connection of its node superseded (applyReport).
var errSuperseded = errors.New("reconciler: a newer connection of the node superseded the stream")

// report applies an execution report of nc (reports).
func (r *Reconciler) report(ctx context.Context, nc *nodeConn, rep *nodev1.ExecutionReport) error {
	return r.reports(ctx, nc, []*nodev1.ExecutionReport{rep})
}

// resync applies the executions of nc's Hello and returns its full desired
// state, holding one of the resync tokens (half the CPUs, at least one):
// after a restart every node connects at once, and without the tokens
// a thousand resyncs share the CPUs with the few live commands (a stop
// then waited seconds for its node's report to be applied). A node waiting
// for a token is not silent (its stream is open, the wait is ctrl's): it
// counts as heard every second meanwhile.
func (r *Reconciler) resync(ctx context.Context, nc *nodeConn, hello *nodev1.Hello) (*nodev1.ConnectResponse, error) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for taken := false; !taken; {
		select {
		case r.resyncs <- struct{}{}:
			taken = true
		case <-tick.C:
			r.seen(nc)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	defer func() { <-r.resyncs }()
	if err := r.helloReports(ctx, nc, hello.GetExecutions()); err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("a report could not be stored; connect again and send the full state"))
	}
	return r.fullState(ctx, nc)
}

// helloChunk is how many of the executions a Hello carries one
// transaction applies.
const helloChunk = 64

// helloReports applies the executions a Hello carries, helloChunk to a
// transaction (reports), those that change nothing left out (changing):
// after a restart of ctrl every node's Hello carries every execution as
// last reported, and writing nothing for them keeps the store's writer (the
// one SQLite has) for the reports that do, stops' among them.
func (r *Reconciler) helloReports(ctx context.Context, nc *nodeConn, reps []*nodev1.ExecutionReport) error {
	for chunk := range slices.Chunk(reps, helloChunk) {
		if chunk = r.changing(ctx, nc.id, chunk); len(chunk) == 0 {
			continue
		}
		if err := r.reports(ctx, nc, chunk); err != nil {
			return err
		}
	}
	return nil
}

// reports applies execution reports of nc in one transaction
// (applyReports). An error means the reports are lost (the store could not
// take them): the caller ends the stream (reportLost), so that the node
// connects again and sends its full state, these reports' latest form
// included. Reports of a superseded stream are dropped, and the stream
// ended: they are not lost, the newer stream's Hello carried the newer
// state.
func (r *Reconciler) reports(ctx context.Context, nc *nodeConn, reps []*nodev1.ExecutionReport) error {
	done, err := r.applyReports(ctx, nc.id, nc.epoch, reps)
	if errors.Is(err, errSuperseded) {
		r.supersede(nc)
		return nil
	}
	if err != nil {
		r.log.Error("apply reports", "node_id", nc.id, "reports", len(reps),
			"workspace_id", nodewire.Cut(reps[0].GetWorkspaceId(), 64), "error", err.Error())
		return err
	}
	// Before anything else: waiters return as soon as the commit has.
	for _, id := range done {
		r.store.Notify(store.WorkspaceTopic(id))
	}
	r.wake()
	return nil
}

// reportLost ends nc's stream after a report of it could not be stored
// (the store unavailable, a transaction that kept failing to serialize):
// the node reconnects, to this replica or another, and its Hello carries
// the latest state of every execution and Volume, so nothing it reported
// is lost for good. Nothing is ended when ctx is done (the stream ends
// anyway).
func (r *Reconciler) reportLost(ctx context.Context, nc *nodeConn, err error) {
	if err == nil || ctx.Err() != nil {
		return
	}
	nc.end(connect.NewError(connect.CodeUnavailable, errors.New("a report could not be stored; connect again and send the full state")))
}

// writeSeen writes to the store when each node whose stream this replica
// holds was last heard (nodeConn.lastSeen), for those heard since the last
// write: one write for all of them (Store.TouchNodes), which Run makes
// once a second (seenEvery). A write per message instead was ~200
// transactions a second with 1,000 nodes, each one a conflict PostgreSQL's
// SERIALIZABLE could abort others for. The store's last_seen is what other
// replicas (silent-node detection on the fleet lease's holder) and
// restarts see; it may be up to seenEvery older than the last message,
// well within the node grace. A stream whose node a newer connection
// registered writes nothing and ends (supersede).
func (r *Reconciler) writeSeen(ctx context.Context) {
	r.mu.Lock()
	var touches []store.NodeTouch
	conns := map[string]*nodeConn{}
	for id, nc := range r.nodes {
		if nc.lastSeen.After(nc.stored) {
			touches = append(touches, store.NodeTouch{ID: id, Epoch: nc.epoch, Seen: nc.lastSeen})
			conns[id] = nc
		}
	}
	r.mu.Unlock()
	if len(touches) == 0 {
		return
	}
	stale, err := r.store.TouchNodes(ctx, touches)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("record when nodes were heard", "nodes", len(touches), "error", err.Error())
		}
		return
	}
	r.mu.Lock()
	for _, t := range touches {
		if nc := conns[t.ID]; nc.stored.Before(t.Seen) {
			nc.stored = t.Seen
		}
	}
	r.mu.Unlock()
	for _, id := range stale {
		r.supersede(conns[id])
	}
}

// seenEvery is how often Run writes when nodes were last heard
// (writeSeen).
const seenEvery = time.Second

// writeSeenEvery runs writeSeen every seenEvery until ctx is done.
func (r *Reconciler) writeSeenEvery(ctx context.Context) {
	every(ctx, seenEvery, func() { r.writeSeen(ctx) })
}

// fullState is the desired state of every Workspace on nc's node, read in
// one store view, which it then counts as sent, with the Egresses deleted
// within the last hour.
func (r *Reconciler) fullState(ctx context.Context, nc *nodeConn) (*nodev1.ConnectResponse, error) {
	var on []*store.Workspace
	var out *nodev1.DesiredState
	if err := r.store.View(ctx, func(tx store.Tx) error {
		out = &nodev1.DesiredState{Full: true}
		var err error
		if on, err = tx.WorkspacesOnNode(ctx, nc.id); err != nil {
			return err
		}
		nr := newNetReader(ctx, tx, r.log)
		for _, w := range on {
			d, err := nr.desired(w)
			if err != nil {
				return err
			}
			out.Workspaces = append(out.Workspaces, d)
		}
		if out.Volumes, err = r.volumesOf(ctx, tx, nc); err != nil {
			return err
		}
		out.Platform, err = artifact.DesiredPlatform(ctx, tx)
		return err
	}); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range on {
		nc.sent[w.ID] = w.Generation
	}
	r.fullPending(nc, out)
	return &nodev1.ConnectResponse{Desired: out}, nil
}

func templateMap(list []*nodev1.TemplateInfo) map[string]string {
	m := make(map[string]string, len(list))
	for _, t := range list {
		m[t.GetTemplateId()] = t.GetVersion()
	}
	return m
}

// LastSeen returns when the last message of node's stream arrived (by the
// reconciler's clock); ok is false when the node has no stream to this
// ctrl.
func (r *Reconciler) LastSeen(node string) (t time.Time, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	nc := r.nodes[node]
	if nc == nil {
		return time.Time{}, false
	}
	return nc.lastSeen, true
}

// keyDenied reports whether keyHash is on the deny list.
func (r *Reconciler) keyDenied(ctx context.Context, keyHash []byte) (bool, error) {
	denied := false
	err := r.store.View(ctx, func(tx store.Tx) error {
		_, err := tx.GetDeniedNodeKey(ctx, keyHash)
		switch {
		case err == nil:
			denied = true
		case errors.Is(err, store.ErrNotFound):
			err = nil
		}
		return err
	})
	return denied, err
}
