// Package reconciler drives each Workspace's observed state towards its
// desired state. It has three jobs, one file each:
//
//   - stream.go serves NodeService: one bidi stream per node, opened by a
//     Hello (capacity, templates, the executions the node holds) and answered
//     with the node's full desired state, then changes; reports and
//     heartbeats come back on it.
//   - placement.go chooses a node for an unplaced Workspace: a connected
//     ACTIVE node that holds its template (or fetches its published
//     version) and has the memory and CPU it asks for within its overcommit
//     ratios, the one with the most free memory (ties go to the smallest
//     node ID); a Workspace no node can hold fails after
//     Config.PlacementTimeout. fleet.go keeps the fleet's records
//     (fleet.View) placement reads, and ends what an isolated node or a
//     denied key holds open.
//   - loop.go is the control loop: on every kick and every second it places
//     pending Workspaces, pushes desired state nodes have not been sent yet,
//     and turns the Workspaces of a node silent beyond Config.NodeGrace
//     UNKNOWN.
//
// report.go holds the derivations: how a report of the current generation
// sets the public state, completes or fails the in-flight command (with its
// reason, stage and retryability), records the guest's condition and the
// network policy status, and records a guest that powered itself off as a
// stop. network.go is the network side: the NetworkConfig of a desired
// state (policy, Egresses and Resolver, read from the store when the state
// is built), network_policy_status, the end of a policy change's command,
// Repush after an Egress or Resolver update, and the broadcast of deleted
// Egresses.
//
// Everything it knows lives in the store, so a restarted ctrl continues from
// the rows: nothing is lost and nothing runs twice. One clock (Config.Now)
// dates everything, node liveness included.
package reconciler

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"time"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/gen/kibotos/node/v1/nodev1connect"
	"github.com/kibotos/kibotos/internal/fleet"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// Config configures a Reconciler.
type Config struct {
	// Store holds everything; the reconciler notifies its Notifier (topic
	// store.WorkspaceTopic) after each commit that completes a command.
	Store store.Store
	// Log receives the reconciler's logs; nil discards them.
	Log *slog.Logger
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// NodeGrace is how long a node may stay silent before its Workspaces
	// turn UNKNOWN; zero is 15 seconds.
	NodeGrace time.Duration
	// PlacementTimeout is how long a Workspace waits for a node that can
	// hold it before its command fails; zero is one minute.
	PlacementTimeout time.Duration
	// OnDenyNodeKey, when set, is called after DenyNodeKey committed, with
	// the denied key: ctrl closes the data tunnels opened with it.
	OnDenyNodeKey func(keyHash []byte)
	// OnEndDataPlane, when set, is called by EndDataPlane with the node
	// whose data plane ends (an isolated node): ctrl closes its data
	// tunnels.
	OnEndDataPlane func(nodeID string)
	// FetchArtifact serves NodeService.FetchArtifact to a verified node
	// peer (internal/artifact); nil answers unimplemented.
	FetchArtifact func(ctx context.Context, req *nodev1.FetchArtifactRequest, send func(*nodev1.FetchArtifactResponse) error) error
	// Leader, when set, reports whether this replica holds the fleet lease
	// (internal/lease): only then does the loop do the fleet-wide work
	// (placement timeouts, silent-node detection, the drain rule). Nil:
	// always (one ctrl).
	Leader func() bool
	// Fence, when set, is called inside the write transaction of each unit
	// of the fleet-wide work (failing a placement at its timeout, marking a
	// silent node's Workspaces UNKNOWN, the drain rule's stop) before it
	// writes: lease.Keeper.Check, which refuses (lease.ErrNotHeld) when
	// the lease row no longer names this replica with its fence, so a
	// stale holder's unit rolls back. Nil: no check (one ctrl).
	Fence func(ctx context.Context, tx store.Tx) error
}

// Reconciler is ctrl's control loop and the server side of NodeService.
type Reconciler struct {
	store            store.Store
	log              *slog.Logger
	clock            func() time.Time
	nodeGrace        time.Duration
	placementTimeout time.Duration
	onDeny           func(keyHash []byte)
	onEndDataPlane   func(nodeID string)
	fetchArtifact    func(ctx context.Context, req *nodev1.FetchArtifactRequest, send func(*nodev1.FetchArtifactResponse) error) error
	leader           func() bool
	fence            func(ctx context.Context, tx store.Tx) error

	kick chan struct{}
	// resyncs holds a token for each stream applying its Hello and building
	// its full state (resync).
	resyncs chan struct{}

	// nodeLoads, fleetLoads and usageLoads serialize the loads of the node
	// records (loadNodes), the fleet's records (loadFleet) and the usage
	// cache (loadUsage): the passes' and reloadEvery's, so that an older
	// read is never learnt after a newer one. One lock each: a load of one
	// never waits for a load of another.
	nodeLoads, fleetLoads, usageLoads sync.Mutex

	mu        sync.Mutex
	nodes     map[string]*nodeConn          // connected nodes
	caps      map[string]workspace.Capacity // known nodes, connected or not
	templates map[string]map[string]string  // node → template → version
	features  map[string]map[string]bool    // node → its Hello.features
	// agentRatio is each known node's Hello capacity
	// memory_overcommit_ratio (kibotos-node --memory-overcommit-ratio; 0
	// when not given).
	agentRatio map[string]float64
	// fleet is the latest fleet.View (fleet.go).
	fleet fleetCache
	// usage is every node's use as placement last read it (placement.go).
	usage usageCache
	// deleted are the Egresses deleted recently (EgressDeleted), named in
	// every full state.
	deleted recentIDs
	// reclaimed are the artifact digests reclaimed recently
	// (ArtifactReclaimed), named in every full state.
	reclaimed recentIDs
	// volPending are Volumes this reconciler changed whose node has not
	// been sent the change yet (volume.go).
	volPending map[string]time.Time
	// admitted are the Workspaces this replica admitted a command of
	// within handoff, by when (by the monotonic wall clock): it places
	// them (Admitted).
	admitted map[string]time.Time
	// mem is the host-memory policy's state (hostmemory.go).
	mem hostMemory
	// stored is every node's stored record as last read (nodes.go), and
	// nodeCache when; registered is the epoch of each node's latest
	// registration by this ctrl (registerKey), which attach gives its
	// stream.
	stored     map[string]storedNode
	nodeCache  nodeCache
	registered map[string]int64
	// quiet holds the silent nodes whose Workspaces are all marked UNKNOWN,
	// so that later passes skip them until the node connects again.
	quiet map[string]bool
	// judging is when this ctrl began judging silence: its start, or the
	// first pass after it took the fleet lease (zero while another replica
	// holds it). A node is silent only once it was not heard from for the
	// grace after that too (markSilent): the time no replica could hear
	// it — ctrl restarting, the lease changing hands — does not count
	// against it, as Kubernetes' node lifecycle controller gives every
	// node a full grace from its own start.
	judging time.Time
}

// nodeConn is one connected node's stream.
type nodeConn struct {
	id   string
	send chan *nodev1.ConnectResponse
	// replaced is closed when a newer stream of the same node replaces this
	// one, or its key is denied (then endErr says so; see end). send is
	// never closed: a push that took this connection just before it was
	// replaced must not panic.
	replaced chan struct{}
	endErr   error
	// epoch is the connection epoch its Hello registered (store.Node.Epoch):
	// its writes to the node's record check it.
	epoch    int64
	lastSeen time.Time         // last message received, by the reconciler's clock
	sent     map[string]uint64 // workspace → generation pushed
	volSent  map[string]uint64 // Volume → generation pushed
	pool     string
	stored   time.Time // when lastSeen was last written to the store
	keyHash  []byte    // the key of the certificate the stream came with
	// deletedEgresses are deleted Egresses not sent on this stream yet;
	// reclaimedDigests likewise reclaimed artifact digests; platformPending:
	// the Platform changed since it was sent (flushPending).
	deletedEgresses  []string
	reclaimedDigests []string
	platformPending  bool
	endOnce          sync.Once
}

// end makes the stream's Connect return err: nil when a newer stream
// replaced it, the refusal when its key was denied. Only the first call
// counts. Call it with the Reconciler's mu held.
func (nc *nodeConn) end(err error) {
	nc.endOnce.Do(func() {
		nc.endErr = err
		close(nc.replaced)
	})
}

var _ nodev1connect.NodeServiceHandler = (*Reconciler)(nil)

// New returns a Reconciler; call Run to start its loop.
func New(cfg Config) *Reconciler {
	r := &Reconciler{
		store:            cfg.Store,
		log:              cfg.Log,
		clock:            cfg.Now,
		nodeGrace:        cfg.NodeGrace,
		placementTimeout: cfg.PlacementTimeout,
		onDeny:           cfg.OnDenyNodeKey,
		onEndDataPlane:   cfg.OnEndDataPlane,
		fetchArtifact:    cfg.FetchArtifact,
		leader:           cfg.Leader,
		fence:            cfg.Fence,
		stored:           map[string]storedNode{},
		registered:       map[string]int64{},
		kick:             make(chan struct{}, 1),
		resyncs:          make(chan struct{}, max(1, runtime.GOMAXPROCS(0)/2)),
		nodes:            map[string]*nodeConn{},
		caps:             map[string]workspace.Capacity{},
		templates:        map[string]map[string]string{},
		features:         map[string]map[string]bool{},
		agentRatio:       map[string]float64{},
		quiet:            map[string]bool{},
		volPending:       map[string]time.Time{},
		admitted:         map[string]time.Time{},
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.clock == nil {
		r.clock = time.Now
	}
	if r.nodeGrace == 0 {
		r.nodeGrace = 15 * time.Second
	}
	if r.placementTimeout == 0 {
		r.placementTimeout = time.Minute
	}
	r.judging = r.now()
	return r
}

// now is the clock's time as the store keeps it (UTC, microseconds).
// leads reports whether this replica does the fleet-wide work now
// (Config.Leader); it is asked before each unit of that work.
func (r *Reconciler) leads() bool { return r.leader == nil || r.leader() }

// fenced runs Config.Fence inside tx, the transaction of one unit of the
// fleet-wide work.
func (r *Reconciler) fenced(ctx context.Context, tx store.Tx) error {
	if r.fence == nil {
		return nil
	}
	return r.fence(ctx, tx)
}

func (r *Reconciler) now() time.Time {
	return r.clock().UTC().Truncate(time.Microsecond)
}

// Kick wakes the loop. An admission may have moved a Workspace of a silent
// node out of UNKNOWN, so silent nodes are checked again.
func (r *Reconciler) Kick() {
	r.mu.Lock()
	clear(r.quiet)
	r.mu.Unlock()
	r.wake()
}

// wake wakes the loop without checking silent nodes again: for what a
// node's own stream brings (a report, an Inventory, a connect), which
// changes no Workspace of another, silent node. With many nodes reporting,
// Kick there would make the lease holder re-read every silent node's
// Workspaces at every pass.
func (r *Reconciler) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// EndStreams ends every node stream this ctrl holds, cleanly: for a
// shutdown, so that the nodes reconnect (to another replica when they know
// one) instead of holding the server open until its shutdown times out.
func (r *Reconciler) EndStreams() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, nc := range r.nodes {
		nc.end(nil)
	}
}

// KickAll wakes this reconciler and, through the store's notifications,
// the reconcilers of the other ctrl replicas (store.ReconcileTopic): what
// an admission calls, since the replica holding the node's stream may be
// another one.
func (r *Reconciler) KickAll() {
	r.Kick()
	r.store.Notify(store.ReconcileTopic)
}

// Admitted records that this replica admitted a command of Workspace id
// (a create, or a command on a Workspace that may have no node yet) and
// wakes the loop: for handoff from now, placing it is this replica's work,
// and only then the fleet lease holder's (placePending). The other
// replicas are not woken: a Workspace without a node needs no push.
func (r *Reconciler) Admitted(id string) {
	r.mu.Lock()
	if len(r.admitted) < maxAdmitted {
		r.admitted[id] = time.Now()
	} // else the lease holder places it after handoff
	r.mu.Unlock()
	r.wake()
}

// handoff is how long the replica that admitted a Workspace is the only
// one to place it; then the fleet lease's holder places it (the admitting
// replica died, or fell behind). maxAdmitted bounds the Workspaces a
// replica remembers having admitted within handoff.
const (
	handoff     = time.Second
	maxAdmitted = 10000
)

// wakeOnNotify wakes this reconciler until ctx ends: Kick at each
// notification of store.ReconcileTopic (another replica's KickAll, or
// this one's), wake at each of store.PushTopic.
func (r *Reconciler) wakeOnNotify(ctx context.Context) {
	go r.wakeOn(ctx, store.PushTopic, r.wake)
	r.wakeOn(ctx, store.ReconcileTopic, r.Kick)
}

// wakeOn calls wake at each notification of topic until ctx ends.
func (r *Reconciler) wakeOn(ctx context.Context, topic string, wake func()) {
	for {
		changed, release := r.store.Subscribe(topic)
		select {
		case <-ctx.Done():
			release()
			return
		case <-changed:
			release()
			wake()
		}
	}
}

// MaxCapacity is the capacity of the largest known node that is not
// RETIRED, its memory as placement accounts it (times the node's memory
// overcommit ratio; its CPU is what one Workspace may have there).
func (r *Reconciler) MaxCapacity() workspace.Capacity {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := r.fleetView()
	var best workspace.Capacity
	for id, c := range r.caps {
		if v.State(id) == fleet.StateRetired {
			continue
		}
		ratios, _ := v.Ratios(id, r.agentRatio[id])
		c.MemoryMiB = fleet.Apply(c.MemoryMiB, ratios.Memory)
		if c.MemoryMiB > best.MemoryMiB {
			best = c
		}
	}
	return best
}

// Template resolves a template ID to the version a node holds ("" when only
// the built-in default is known and no node reported it yet). ok is false
// for a template no node has reported.
func (r *Reconciler) Template(id string) (version string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.templates {
		if v, found := m[id]; found {
			return v, true
		}
	}
	return "", id == workspace.DefaultTemplate
}
