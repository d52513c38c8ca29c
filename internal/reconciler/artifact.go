package reconciler

import (
	"context"
	"slices"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/artifact"
	"github.com/kibotos/kibotos/internal/store"
)

// recentMemory is how long a deleted Egress or a reclaimed artifact digest
// is named in every full state.
const recentMemory = time.Hour

// recentIDs are IDs that every node must hear of (deleted Egresses,
// reclaimed digests): each connected node is told once by a partial
// state (flushPending), and the full state of a node that connects within
// recentMemory names them too. The memory is this ctrl's: a node connected
// to another replica hears of them only at its next full state from this
// one. Callers hold the Reconciler's mu.
type recentIDs struct {
	items []recentID
}

type recentID struct {
	id string
	at time.Time
}

// add remembers id at now and forgets what is older than recentMemory.
func (m *recentIDs) add(id string, now time.Time) {
	m.items = slices.DeleteFunc(m.items, func(d recentID) bool { return d.id == id || now.Sub(d.at) > recentMemory })
	m.items = append(m.items, recentID{id: id, at: now})
}

// list returns the IDs remembered within recentMemory of now, oldest first.
func (m *recentIDs) list(now time.Time) []string {
	var out []string
	for _, d := range m.items {
		if now.Sub(d.at) <= recentMemory {
			out = append(out, d.id)
		}
	}
	return out
}

// notifyAll remembers id in m and queues it on every connected node's
// pending list (pending picks the list of a nodeConn), then flushes.
func (r *Reconciler) notifyAll(m *recentIDs, id string, pending func(*nodeConn) *[]string) {
	now := r.now()
	r.mu.Lock()
	m.add(id, now)
	for _, nc := range r.nodes {
		if p := pending(nc); !slices.Contains(*p, id) {
			*p = append(*p, id)
		}
	}
	r.mu.Unlock()
	r.flushPending()
}

// ArtifactReclaimed tells every node that no AVAILABLE artifact version has
// digest any more (DesiredState.reclaimed_digests), so that each deletes
// its cached copy; ApplyArtifactReclamation calls it after its commit.
func (r *Reconciler) ArtifactReclaimed(digest string) {
	r.notifyAll(&r.reclaimed, digest, func(nc *nodeConn) *[]string { return &nc.reclaimedDigests })
}

// PlatformChanged pushes the default of Platform "sandbox"
// (DesiredState.platform) to every connected node; SetPlatformDefault
// calls it after its commit.
func (r *Reconciler) PlatformChanged() {
	r.mu.Lock()
	for _, nc := range r.nodes {
		nc.platformPending = true
	}
	r.mu.Unlock()
	r.flushPending()
}

// flushPending sends each connected node what it has not been told of yet
// outside its Workspaces' states: deleted Egresses, reclaimed digests, the
// Platform. A stream that is backed up keeps them for the next pass.
func (r *Reconciler) flushPending() {
	r.mu.Lock()
	needPlatform := false
	for _, nc := range r.nodes {
		needPlatform = needPlatform || nc.platformPending
	}
	r.mu.Unlock()
	var platform *nodev1.DesiredPlatform
	if needPlatform {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := r.store.View(ctx, func(tx store.Tx) error {
			var err error
			platform, err = artifact.DesiredPlatform(ctx, tx)
			return err
		})
		cancel()
		if err != nil {
			r.log.Warn("read the desired platform", "error", err.Error())
			needPlatform = false // the next pass retries
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, nc := range r.nodes {
		sendPlatform := needPlatform && nc.platformPending && platform != nil
		if len(nc.deletedEgresses) == 0 && len(nc.reclaimedDigests) == 0 && !sendPlatform {
			if needPlatform && platform == nil {
				nc.platformPending = false
			}
			continue
		}
		ds := &nodev1.DesiredState{DeletedEgressIds: slices.Clone(nc.deletedEgresses), ReclaimedDigests: slices.Clone(nc.reclaimedDigests)}
		if sendPlatform {
			ds.Platform = platform
		}
		select {
		case nc.send <- &nodev1.ConnectResponse{Desired: ds}:
			nc.deletedEgresses, nc.reclaimedDigests = nil, nil
			if sendPlatform {
				nc.platformPending = false
			}
		default:
		}
	}
}

// fullPending fills the parts of a full state that are not Workspaces'
// or Volumes' (deleted Egresses, reclaimed digests; platform is read in
// the state's view) and counts them as sent on nc. Callers hold r.mu.
func (r *Reconciler) fullPending(nc *nodeConn, out *nodev1.DesiredState) {
	now := r.now()
	out.DeletedEgressIds = r.deleted.list(now)
	out.ReclaimedDigests = r.reclaimed.list(now)
	nc.deletedEgresses, nc.reclaimedDigests, nc.platformPending = nil, nil, false
}

// template sets the published Template version of a desired Workspace and
// where the node fetches it (nothing for the template the nodes build).
func (n *netReader) template(d *nodev1.DesiredWorkspace, pub *ctrlv1.Workspace) error {
	t := pub.GetTemplate()
	src, err := artifact.TemplateSource(n.ctx, n.tx, t.GetTemplateId(), t.GetVersion())
	if err != nil || src == nil {
		return err
	}
	d.TemplateVersion, d.TemplateSource = t.GetVersion(), src
	return nil
}
