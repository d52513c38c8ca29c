package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/commandid"
	"github.com/kibotos/kibotos/internal/fault"
	"github.com/kibotos/kibotos/internal/ids"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
	"github.com/kibotos/kibotos/internal/workspace"
)

// The host-memory policy (docs/host-memory.md). A node judges its own
// memory (internal/node/memwatch) and says CRITICAL in its heartbeats when
// its workspaces use too much of its host memory budget. ctrl then opens an
// episode for the node and stops its workspaces one at a time, each
// through a recorded command, until the node reports a level below
// CRITICAL, which ends the episode:
//
//   - An episode is a command record host-memory/<node>/<n> (object kind
//     "node", initiator HOST_MEMORY), PROCESSING while the episode is
//     open, COMPLETED when it ended. n counts the node's episodes from 1
//     and is found again in the records after a restart (episodeOf); its
//     result is a MemoryCondition: the node's condition when the episode
//     opened, its workspaces replaced by the victims in the order chosen,
//     each with its use when chosen.
//   - A victim's stop is a Workspace command host-memory/<node>/<n>/<ws>
//     (kind STOP, initiator HOST_MEMORY), admitted as a caller's
//     StopWorkspace is (workspace.Service.AdmitCtrlStop): a normal stop,
//     writeback first. When it has not completed HostMemoryForceAfter
//     after it began, or failed leaving the workspace holding its
//     execution, host-memory/<node>/<n>/<ws>/force forces it. Each says
//     why in its message (WorkspaceCommand.message): the node's use
//     against its budget and the victim's use (stopMessage), or why the
//     stop was forced (forceMessage).
//   - The victim: largest use first (ties: smallest workspace ID) among
//     the workspaces the condition lists that are AVAILABLE on the node,
//     that were first listed HostMemoryMinAge ago or more (a recent start
//     is spared; a workspace already listed by the first condition this
//     ctrl received of the node counts from its latest report, which
//     came after its start), and that the episode did not stop yet
//     (chooseVictim).
//   - One at a time: the next victim is chosen only from a condition ctrl
//     received after the previous victim's stop completed (the node sends
//     the stop's report before any later heartbeat on the same stream, so
//     that condition no longer counts the stopped workspace), and at most
//     HostMemoryMaxStops per episode.
//   - Exactly once: every decision is taken in one transaction that locks
//     the episode's command ID and reads its record, and every stop has a
//     deterministic ID, recorded with the stop's admission (the commands
//     table's unique key); two heartbeats handled together, by one ctrl or
//     by two replicas, cannot stop twice or choose two victims at once.
const (
	// HostMemoryMinAge: a workspace first listed by a node's condition
	// less than this ago started recently and is not stopped.
	HostMemoryMinAge = 30 * time.Second
	// HostMemoryForceAfter bounds a normal stop of the policy, and then
	// its forced stop: past it the stop is forced, and past it again the
	// policy moves on to the next victim.
	HostMemoryForceAfter = 30 * time.Second
	// HostMemoryMaxStops bounds the workspaces one episode stops.
	HostMemoryMaxStops = 8
)

// hostMemoryMethod is the Method of the policy's command records.
const hostMemoryMethod = "ctrl/host-memory"

// nodeObjectKind is the object kind of an episode's record.
const nodeObjectKind = "node"

// hostMemory is the policy's state on this ctrl: per node, the latest
// condition and what is known of its episodes. The store is the
// authority; this only saves reads.
type hostMemory struct {
	mu    sync.Mutex
	nodes map[string]*memNode
	// The policy's bounds; zero are the constants (tests set them).
	minAge, forceAfter time.Duration
	maxStops           int
}

// memNode is the policy's state of one node.
type memNode struct {
	pending    *nodev1.MemoryCondition // latest condition not evaluated yet
	receivedAt time.Time               // when pending arrived
	busy       bool                    // a worker evaluates the node
	// listed is when each workspace the latest condition lists was first
	// listed (zero: already listed by the first condition this ctrl saw,
	// which counts as long ago).
	listed   map[string]time.Time
	baseline bool // a condition was seen
	// known says episode and open are what the store says (as far as
	// this ctrl changed it).
	known   bool
	episode uint64 // the node's latest episode, 0 for none
	open    bool
	warned  uint64 // the episode whose "nothing to stop" was logged
}

func (h *hostMemory) node(id string) *memNode {
	if h.nodes == nil {
		h.nodes = map[string]*memNode{}
	}
	n := h.nodes[id]
	if n == nil {
		n = &memNode{listed: map[string]time.Time{}}
		h.nodes[id] = n
	}
	return n
}

func (h *hostMemory) bounds() (minAge, forceAfter time.Duration, maxStops int) {
	minAge, forceAfter, maxStops = HostMemoryMinAge, HostMemoryForceAfter, HostMemoryMaxStops
	if h.minAge > 0 {
		minAge = h.minAge
	}
	if h.forceAfter > 0 {
		forceAfter = h.forceAfter
	}
	if h.maxStops > 0 {
		maxStops = h.maxStops
	}
	return
}

// episodeID is the command ID of a node's episode n; victimID that of a
// victim's stop in it.
func episodeID(node string, n uint64) string {
	return "host-memory/" + node + "/" + strconv.FormatUint(n, 10)
}

func victimID(node string, n uint64, ws string) string { return episodeID(node, n) + "/" + ws }

// boundedCondition keeps what the policy may use of a node's condition:
// a known level, at most 256 workspaces with IDs that can exist.
func boundedCondition(c *nodev1.MemoryCondition) *nodev1.MemoryCondition {
	out := &nodev1.MemoryCondition{Level: c.GetLevel(), UsedMib: c.GetUsedMib(), LimitMib: c.GetLimitMib(), PsiSomeAvg10: c.GetPsiSomeAvg10()}
	if _, ok := nodev1.MemoryPressureLevel_name[int32(out.Level)]; !ok {
		out.Level = nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_UNSPECIFIED
	}
	for _, w := range c.GetWorkspaces() {
		if len(out.Workspaces) == 256 {
			break
		}
		if id := w.GetWorkspaceId(); id != "" && len(id) <= ids.MaxLen && commandid.ValidateFormat(id) == nil {
			out.Workspaces = append(out.Workspaces, &nodev1.WorkspaceMemory{WorkspaceId: id, UsedMib: w.GetUsedMib()})
		}
	}
	return out
}

// memoryCondition takes the condition of a node's heartbeat (nil: the
// node does not measure). It never blocks the stream: the evaluation runs
// in one worker per node, on the latest condition.
func (r *Reconciler) memoryCondition(ctx context.Context, node string, c *nodev1.MemoryCondition) {
	if c == nil || commandid.ValidateFormat(victimID(node, 1<<63, "ws-"+"00000000000000000000")+"/force") != nil {
		return // not measured, or a node ID no command ID can hold
	}
	c = boundedCondition(c)
	now := r.now()
	h := &r.mem
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.node(node)
	listed := make(map[string]time.Time, len(c.GetWorkspaces()))
	for _, w := range c.GetWorkspaces() {
		at, ok := n.listed[w.GetWorkspaceId()]
		if !ok && n.baseline {
			at = now
		}
		listed[w.GetWorkspaceId()] = at
	}
	n.listed, n.baseline = listed, true
	n.pending, n.receivedAt = c, now
	critical := c.GetLevel() == nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_CRITICAL
	if n.busy || (n.known && !n.open && !critical) {
		return
	}
	n.busy = true
	go r.memoryWorker(ctx, node)
}

// memoryWorker evaluates a node's pending conditions until none is left.
func (r *Reconciler) memoryWorker(ctx context.Context, node string) {
	h := &r.mem
	for {
		h.mu.Lock()
		n := h.node(node)
		c, at := n.pending, n.receivedAt
		n.pending = nil
		if c == nil || ctx.Err() != nil {
			n.busy = false
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		if err := r.evaluateMemory(ctx, node, c, at); err != nil && ctx.Err() == nil {
			r.log.Warn("host memory: evaluate the node's condition", "node_id", node, "error", err.Error())
		}
	}
}

// evaluateMemory acts on condition c of node, received at receivedAt:
// below CRITICAL it ends the open episode; CRITICAL opens one if none is
// open and takes the episode's next step.
func (r *Reconciler) evaluateMemory(ctx context.Context, node string, c *nodev1.MemoryCondition, receivedAt time.Time) error {
	episode, open, err := r.episodeOf(ctx, node)
	if err != nil {
		return err
	}
	if c.GetLevel() != nodev1.MemoryPressureLevel_MEMORY_PRESSURE_LEVEL_CRITICAL {
		if open {
			return r.endEpisode(ctx, node, episode, c)
		}
		return nil
	}
	if !open {
		if episode, err = r.openEpisode(ctx, node, episode+1, c); err != nil {
			return err
		}
	}
	return r.stepEpisode(ctx, node, episode, c, receivedAt)
}

// episodeOf returns the node's latest episode and whether it is open: from
// this ctrl's memory, else from the store, where episodes 1..n are
// recorded densely (found by doubling, then bisection).
func (r *Reconciler) episodeOf(ctx context.Context, node string) (uint64, bool, error) {
	h := &r.mem
	h.mu.Lock()
	n := h.node(node)
	if n.known {
		defer h.mu.Unlock()
		return n.episode, n.open, nil
	}
	h.mu.Unlock()
	var latest uint64
	var open bool
	err := r.store.View(ctx, func(tx store.Tx) error {
		exists := func(k uint64) (*store.Command, error) {
			c, err := tx.GetCommand(ctx, episodeID(node, k))
			if errors.Is(err, store.ErrNotFound) {
				return nil, nil
			}
			return c, err
		}
		// lo exists (or is 0), hi does not.
		lo, hi := uint64(0), uint64(1)
		for {
			c, err := exists(hi)
			if err != nil {
				return err
			}
			if c == nil {
				break
			}
			lo, hi = hi, hi*2
			if hi >= 1<<62 {
				return fmt.Errorf("node %s has more than 2^62 episodes", node)
			}
		}
		for hi-lo > 1 {
			mid := lo + (hi-lo)/2
			c, err := exists(mid)
			if err != nil {
				return err
			}
			if c != nil {
				lo = mid
			} else {
				hi = mid
			}
		}
		latest, open = lo, false
		if lo > 0 {
			c, err := exists(lo)
			if err != nil || c == nil {
				return err
			}
			open = c.Status == store.CommandProcessing
		}
		return nil
	})
	if err != nil {
		return 0, false, err
	}
	r.setEpisode(node, latest, open)
	return latest, open, nil
}

func (r *Reconciler) setEpisode(node string, episode uint64, open bool) {
	h := &r.mem
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.node(node)
	n.known, n.episode, n.open = true, episode, open
}

// forget makes the next evaluation of node read its episodes from the
// store (another replica changed them).
func (r *Reconciler) forget(node string) {
	h := &r.mem
	h.mu.Lock()
	defer h.mu.Unlock()
	h.node(node).known = false
}

// openEpisode records episode n of node, opened on condition c.
func (r *Reconciler) openEpisode(ctx context.Context, node string, n uint64, c *nodev1.MemoryCondition) (uint64, error) {
	now := r.now()
	result, err := proto.Marshal(&nodev1.MemoryCondition{Level: c.GetLevel(), UsedMib: c.GetUsedMib(), LimitMib: c.GetLimitMib(),
		PsiSomeAvg10: c.GetPsiSomeAvg10()})
	if err != nil {
		return 0, err
	}
	id := episodeID(node, n)
	taken := false
	err = r.store.InTx(ctx, func(tx store.Tx) error {
		taken = false
		if err := tx.LockCommand(ctx, id); err != nil {
			return err
		}
		if _, err := tx.GetCommand(ctx, id); err == nil {
			taken = true
			return nil
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		return tx.InsertCommand(ctx, &store.Command{ID: id, Method: hostMemoryMethod, ObjectKind: nodeObjectKind, ObjectID: node,
			Initiator: int(ctrlv1.CommandInitiator_COMMAND_INITIATOR_HOST_MEMORY), Status: store.CommandProcessing,
			Result: result, CreatedAt: now})
	})
	if errors.Is(err, store.ErrDuplicate) {
		taken, err = true, nil
	}
	if err != nil {
		return 0, err
	}
	if taken {
		// Another replica opened it (or it ended already): read again.
		r.forget(node)
		return 0, fmt.Errorf("episode %s was recorded meanwhile; the next condition decides", id)
	}
	r.setEpisode(node, n, true)
	r.log.Warn("host memory: episode opened: the node is CRITICAL", "node_id", node, "episode", id,
		"used_mib", c.GetUsedMib(), "limit_mib", c.GetLimitMib(), "psi_some_avg10", c.GetPsiSomeAvg10())
	return n, nil
}

// endEpisode completes episode n of node: c is below CRITICAL.
func (r *Reconciler) endEpisode(ctx context.Context, node string, n uint64, c *nodev1.MemoryCondition) error {
	id := episodeID(node, n)
	now := r.now()
	var stops int
	err := r.store.InTx(ctx, func(tx store.Tx) error {
		if err := tx.LockCommand(ctx, id); err != nil {
			return err
		}
		rec, err := tx.GetCommand(ctx, id)
		if err != nil || rec.Status == store.CommandCompleted {
			return err
		}
		ep := &nodev1.MemoryCondition{}
		if err := proto.Unmarshal(rec.Result, ep); err == nil {
			stops = len(ep.GetWorkspaces())
		}
		rec.Status, rec.CompletedAt = store.CommandCompleted, now
		return tx.UpdateCommand(ctx, rec)
	})
	if err != nil {
		return err
	}
	r.setEpisode(node, n, false)
	r.log.Info("host memory: episode ended: the node is below CRITICAL", "node_id", node, "episode", id,
		"level", c.GetLevel().String(), "used_mib", c.GetUsedMib(), "limit_mib", c.GetLimitMib(), "stopped", stops)
	return nil
}

// memCandidate is a workspace a node's condition lists, as the policy
// sees it.
type memCandidate struct {
	id      string
	usedMiB uint64
	// listedAt is when a condition first listed it (zero: long ago).
	listedAt time.Time
	// available: AVAILABLE on the node, as the store says.
	available bool
	// stopped: the episode stopped it already.
	stopped bool
}

// chooseVictim is the policy's choice among cands at now: the largest use
// first (ties: the smallest ID) among the AVAILABLE candidates not stopped
// in this episode and listed at least minAge ago.
func chooseVictim(cands []memCandidate, now time.Time, minAge time.Duration) (memCandidate, bool) {
	sorted := slices.Clone(cands)
	slices.SortStableFunc(sorted, func(a, b memCandidate) int {
		if c := cmp.Compare(b.usedMiB, a.usedMiB); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	for _, c := range sorted {
		if c.available && !c.stopped && (c.listedAt.IsZero() || now.Sub(c.listedAt) >= minAge) {
			return c, true
		}
	}
	return memCandidate{}, false
}

// victimStep is what the episode does about its latest victim.
type victimStep int

const (
	victimWait  victimStep = iota // its stop goes on
	victimForce                   // force its stop
	victimDone                    // over: the next victim may follow
)

// victimProgress judges the stop of victim ws (commands stop and force,
// nil when not recorded) at now; for victimDone it returns when the stop
// ended.
func victimProgress(stop, force *store.Command, w *store.Workspace, pub *ctrlv1.Workspace, node string, now time.Time, bound time.Duration) (victimStep, time.Time) {
	switch {
	case force != nil && force.Status == store.CommandCompleted:
		return victimDone, force.CompletedAt
	case force != nil && now.Sub(force.CreatedAt) >= bound:
		return victimDone, now // the forced stop hangs too: move on
	case force != nil:
		return victimWait, time.Time{}
	case stop == nil:
		return victimDone, now
	case stop.Status == store.CommandProcessing && now.Sub(stop.CreatedAt) >= bound:
		return victimForce, time.Time{}
	case stop.Status == store.CommandProcessing:
		return victimWait, time.Time{}
	case stop.ErrorCode != "" && w != nil && w.NodeID == node && w.DeletedAt.IsZero() && w.Power == store.PowerStopped &&
		w.CommandID == "" && pub.GetHoldsExecution():
		// The normal stop failed (no writeback) and the workspace still
		// holds its execution: force it.
		return victimForce, time.Time{}
	}
	return victimDone, stop.CompletedAt
}

// stepEpisode takes episode n's next step on condition c of node,
// received at receivedAt, in one transaction that locks the episode: wait
// for the latest victim's stop, force it, or stop the next victim.
func (r *Reconciler) stepEpisode(ctx context.Context, node string, n uint64, c *nodev1.MemoryCondition, receivedAt time.Time) error {
	minAge, forceAfter, maxStops := r.mem.bounds()
	epID := episodeID(node, n)
	svc := &workspace.Service{Now: r.clock}
	type stopped struct {
		id, command string
		usedMiB     uint64
		force       bool
	}
	var (
		done    *stopped
		ended   bool
		nothing bool // nothing left to stop
		bounded bool // the episode's bound is reached
	)
	h := &r.mem
	h.mu.Lock()
	listed := h.node(node).listed
	h.mu.Unlock()
	err := r.store.InTx(ctx, func(tx store.Tx) error {
		done, ended, nothing, bounded = nil, false, false, false
		now := r.now()
		if err := tx.LockCommand(ctx, epID); err != nil {
			return err
		}
		epRec, err := tx.GetCommand(ctx, epID)
		if err != nil {
			return err
		}
		if epRec.Status == store.CommandCompleted {
			ended = true
			return nil
		}
		ep := &nodev1.MemoryCondition{}
		if err := proto.Unmarshal(epRec.Result, ep); err != nil {
			return fault.Internal("decode episode %s: %v", epID, err)
		}
		victims := ep.GetWorkspaces()
		if len(victims) > 0 {
			last := victims[len(victims)-1].GetWorkspaceId()
			stop, err := optCommand(ctx, tx, victimID(node, n, last))
			if err != nil {
				return err
			}
			force, err := optCommand(ctx, tx, victimID(node, n, last)+"/force")
			if err != nil {
				return err
			}
			w, pub, err := optWorkspace(ctx, tx, last)
			if err != nil {
				return err
			}
			step, at := victimProgress(stop, force, w, pub, node, now, forceAfter)
			switch step {
			case victimWait:
				return nil
			case victimForce:
				id := victimID(node, n, last) + "/force"
				admitted, err := r.admitHostMemoryStop(ctx, tx, svc, id, last, now, true, forceMessage(node, c, stop, forceAfter))
				if err != nil && !refused(err) {
					return err
				}
				if admitted {
					done = &stopped{id: last, command: id, force: true}
					return nil
				}
				// The state machine refuses to force it: it holds no
				// execution of this stop any more; the next victim follows.
				at = stop.CreatedAt
			}
			if receivedAt.Before(at) {
				return nil // measured before the stop ended
			}
		}
		if len(victims) >= maxStops {
			bounded = true
			return nil
		}
		stoppedSet := make(map[string]bool, len(victims))
		for _, v := range victims {
			stoppedSet[v.GetWorkspaceId()] = true
		}
		var cands []memCandidate
		for _, m := range c.GetWorkspaces() {
			id := m.GetWorkspaceId()
			cand := memCandidate{id: id, usedMiB: m.GetUsedMib(), listedAt: listed[id], stopped: stoppedSet[id]}
			if !cand.stopped {
				w, pub, err := optWorkspace(ctx, tx, id)
				if err != nil {
					return err
				}
				cand.available = w != nil && w.NodeID == node && w.DeletedAt.IsZero() &&
					pub.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE
				if cand.listedAt.IsZero() && w != nil {
					// Listed since this ctrl's first condition of the
					// node: it started before the latest report that
					// changed it (its row's ObservedAt) at the latest.
					cand.listedAt = w.ObservedAt
				}
			}
			cands = append(cands, cand)
		}
		for {
			v, ok := chooseVictim(cands, now, minAge)
			if !ok {
				nothing = true
				return nil
			}
			id := victimID(node, n, v.id)
			msg := stopMessage(node, c, v.usedMiB, minAge, len(victims)+1, maxStops, epID)
			admitted, err := r.admitHostMemoryStop(ctx, tx, svc, id, v.id, now, false, msg)
			if err != nil {
				if !refused(err) {
					return err
				}
				admitted = false // refused by the state machine: the next one
			}
			if !admitted {
				for i := range cands {
					if cands[i].id == v.id {
						cands[i].available = false
					}
				}
				continue
			}
			ep.Workspaces = append(ep.Workspaces, &nodev1.WorkspaceMemory{WorkspaceId: v.id, UsedMib: v.usedMiB})
			if epRec.Result, err = proto.Marshal(ep); err != nil {
				return err
			}
			if err := tx.UpdateCommand(ctx, epRec); err != nil {
				return err
			}
			done = &stopped{id: v.id, command: id, usedMiB: v.usedMiB}
			return nil
		}
	})
	if err != nil {
		return err
	}
	switch {
	case ended:
		r.forget(node)
	case done != nil:
		r.store.Notify(store.WorkspaceTopic(done.id))
		r.Kick()
		if done.force {
			r.log.Warn("host memory: forcing the stop of a workspace: its normal stop did not end in time or failed",
				"node_id", node, "episode", epID, "workspace_id", done.id, "command_id", done.command, "bound", forceAfter.String())
		} else {
			r.log.Warn("host memory: stopping a workspace: the node is CRITICAL; largest use first among AVAILABLE workspaces running for "+minAge.String()+" or more",
				"node_id", node, "episode", epID, "workspace_id", done.id, "command_id", done.command,
				"workspace_used_mib", done.usedMiB, "used_mib", c.GetUsedMib(), "limit_mib", c.GetLimitMib(), "psi_some_avg10", c.GetPsiSomeAvg10())
		}
	case nothing, bounded:
		h.mu.Lock()
		nd := h.node(node)
		first := nd.warned != n
		nd.warned = n
		h.mu.Unlock()
		if first && bounded {
			r.log.Warn("host memory: the episode stopped as many workspaces as it may; the node stays CRITICAL", "node_id", node, "episode", epID,
				"max_stops", maxStops, "used_mib", c.GetUsedMib(), "limit_mib", c.GetLimitMib())
		} else if first {
			r.log.Warn("host memory: the node is CRITICAL and no workspace may be stopped (none AVAILABLE and running for "+minAge.String()+" or more)",
				"node_id", node, "episode", epID, "used_mib", c.GetUsedMib(), "limit_mib", c.GetLimitMib())
		}
	}
	return nil
}

// admitHostMemoryStop records, inside tx, the policy's stop of Workspace
// ws under command ID id, saying why in message, unless id is recorded
// already (admitted false). A refusal of the Workspace's state is
// returned as its fault, with nothing written.
func (r *Reconciler) admitHostMemoryStop(ctx context.Context, tx store.Tx, svc *workspace.Service, id, ws string, now time.Time, force bool, message string) (bool, error) {
	if err := tx.LockCommand(ctx, id); err != nil {
		return false, err
	}
	if _, err := tx.GetCommand(ctx, id); err == nil {
		return false, nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return false, err
	}
	rec := &store.Command{ID: id, Method: hostMemoryMethod, ObjectKind: workspace.ObjectKind, ObjectID: ws,
		Kind:      int(ctrlv1.WorkspaceCommandKind_WORKSPACE_COMMAND_KIND_STOP),
		Initiator: int(ctrlv1.CommandInitiator_COMMAND_INITIATOR_HOST_MEMORY), CreatedAt: now,
		Message: nodewire.Cut(message, store.MaxCommandMessage)}
	pub, err := svc.AdmitCtrlStop(ctx, tx, rec, force)
	if err != nil {
		return false, err
	}
	if rec.Result, err = proto.Marshal(&ctrlv1.StopWorkspaceResponse{Workspace: pub, Command: workspace.CommandMessage(rec)}); err != nil {
		return false, err
	}
	if err := tx.InsertCommand(ctx, rec); err != nil {
		return false, err
	}
	return true, nil
}

// stopMessage says why the policy stops a victim using usedMiB, the
// stop-th of episode epID, on condition c of node, e.g. "host memory:
// node n1 used 622 MiB of its 512 MiB budget (CRITICAL); stopped as the
// largest user (604 MiB) among AVAILABLE workspaces listed 30 s or more;
// stop 1 of at most 8 in episode host-memory/n1/1".
func stopMessage(node string, c *nodev1.MemoryCondition, usedMiB uint64, minAge time.Duration, stop, maxStops int, epID string) string {
	return fmt.Sprintf("host memory: node %s used %d MiB of its %d MiB budget (%s); stopped as the largest user (%d MiB) "+
		"among AVAILABLE workspaces listed %s or more; stop %d of at most %d in episode %s",
		node, c.GetUsedMib(), c.GetLimitMib(), levelName(c.GetLevel()), usedMiB, seconds(minAge), stop, maxStops, epID)
}

// forceMessage says why the policy forces the normal stop stop (its
// record) on condition c of node: it did not complete within bound, or
// it failed leaving the workspace holding its execution.
func forceMessage(node string, c *nodev1.MemoryCondition, stop *store.Command, bound time.Duration) string {
	why := fmt.Sprintf("the normal stop %s did not complete within %s", stop.ID, seconds(bound))
	if stop.Status == store.CommandCompleted {
		code := stop.ErrorCode
		d := &ctrlv1.ErrorDetail{}
		if proto.Unmarshal(stop.ErrorDetail, d) == nil && d.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED {
			code += ", " + strings.TrimPrefix(d.GetReason().String(), "FAILURE_REASON_")
		}
		why = fmt.Sprintf("the normal stop %s failed (%s) and the workspace still holds its execution", stop.ID, code)
	}
	return fmt.Sprintf("host memory: node %s still used %d MiB of its %d MiB budget (%s); forced because %s",
		node, c.GetUsedMib(), c.GetLimitMib(), levelName(c.GetLevel()), why)
}

// levelName is a pressure level's name without its prefix ("CRITICAL").
func levelName(l nodev1.MemoryPressureLevel) string {
	return strings.TrimPrefix(l.String(), "MEMORY_PRESSURE_LEVEL_")
}

// seconds writes d as "30 s" when it is whole seconds.
func seconds(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + " s"
	}
	return d.String()
}

// refused reports whether err is the admission's refusal of a Workspace
// (its state, or gone), which wrote nothing.
func refused(err error) bool {
	fe, ok := fault.As(err)
	return ok && (fe.Kind == fault.KindFailedPrecondition || fe.Kind == fault.KindNotFound)
}

// optCommand reads a command; nil when it does not exist.
func optCommand(ctx context.Context, tx store.Tx, id string) (*store.Command, error) {
	c, err := tx.GetCommand(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	return c, err
}

// optWorkspace reads a Workspace; nil when it does not exist.
func optWorkspace(ctx context.Context, tx store.Tx, id string) (*store.Workspace, *ctrlv1.Workspace, error) {
	w, err := tx.GetWorkspace(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	pub, err := workspace.Decode(w)
	return w, pub, err
}
