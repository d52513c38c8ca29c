package reconciler

import (
	"context"

	"google.golang.org/protobuf/proto"

	nodev1 "github.com/kibotos/kibotos/gen/kibotos/node/v1"
	"github.com/kibotos/kibotos/internal/nodewire"
	"github.com/kibotos/kibotos/internal/store"
)

// inventory records what templates and platforms nc's node holds now, as
// its Inventory says (sent when that changed after its Hello): the stored
// Hello's templates and platforms (what GetNode and ListNodes show) and
// the templates placement reads. The node is trusted with nothing but its
// own holdings: an Inventory with more than nodewire.MaxInventoryEntries
// in a list is ignored whole, an entry that cannot name a version a node
// holds is left out, both with a log line; nothing else of the node row
// changes. An Inventory from a stream another one replaced is ignored: on
// this ctrl by its stream, on any replica by the node's connection epoch
// (store.Node.Epoch), checked in the recording transaction; a stream so
// superseded ends.
func (r *Reconciler) inventory(ctx context.Context, nc *nodeConn, inv *nodev1.Inventory) {
	id := nc.id
	if err := nodewire.CheckInventory(inv); err != nil {
		r.log.Warn("node inventory ignored", "node_id", id, "error", err.Error())
		return
	}
	templates, dropped := inventoryEntries(inv.GetTemplates())
	platforms, droppedP := inventoryEntries(inv.GetPlatforms())
	if dropped+droppedP > 0 {
		r.log.Warn("node inventory entries left out", "node_id", id, "templates", dropped, "platforms", droppedP)
	}
	if !r.current(nc) {
		return
	}
	superseded := false
	err := r.store.InTx(ctx, func(tx store.Tx) error {
		superseded = false
		n, err := tx.GetNode(ctx, id)
		if err != nil {
			return err
		}
		if n.Epoch != nc.epoch {
			// A newer connection of the node (here or on another replica)
			// registered since this stream's Hello: its record is newer.
			superseded = true
			return nil
		}
		hello := &nodev1.Hello{}
		if err := proto.Unmarshal(n.Doc, hello); err != nil {
			return err
		}
		hello.Templates, hello.Platforms = templates, platforms
		if n.Doc, err = proto.Marshal(hello); err != nil {
			return err
		}
		return tx.UpsertNode(ctx, n)
	})
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("record node inventory", "node_id", id, "error", err.Error())
		}
		return
	}
	if superseded {
		r.supersede(nc)
		return
	}
	r.nodesChangedHere() // every replica learns the node's templates
	r.mu.Lock()
	if r.nodes[id] == nc {
		r.templates[id] = templateMap(templates)
	}
	r.mu.Unlock()
	r.log.Info("node inventory", "node_id", id, "templates", len(templates), "platforms", len(platforms))
	r.wake()
}

// checkHello applies the rules of an Inventory to the holdings a Hello
// lists, before anything of it is recorded: lists over the bound are
// dropped whole, bad entries left out, both with a log line.
func (r *Reconciler) checkHello(hello *nodev1.Hello) {
	id := hello.GetNodeId()
	if err := nodewire.CheckInventory(&nodev1.Inventory{Templates: hello.GetTemplates(), Platforms: hello.GetPlatforms()}); err != nil {
		r.log.Warn("node hello: templates and platforms ignored", "node_id", id, "error", err.Error())
		hello.Templates, hello.Platforms = nil, nil
		return
	}
	var dropped, droppedP int
	hello.Templates, dropped = inventoryEntries(hello.GetTemplates())
	hello.Platforms, droppedP = inventoryEntries(hello.GetPlatforms())
	if dropped+droppedP > 0 {
		r.log.Warn("node hello: entries left out", "node_id", id, "templates", dropped, "platforms", droppedP)
	}
}

// current reports whether nc is the stream of its node on this ctrl.
func (r *Reconciler) current(nc *nodeConn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nodes[nc.id] == nc
}

// inventoryEntries is list without the entries nodewire.CheckInventoryEntry
// refuses (their count is dropped), copied: nothing of the message is kept.
func inventoryEntries(list []*nodev1.TemplateInfo) (out []*nodev1.TemplateInfo, dropped int) {
	for _, t := range list {
		if nodewire.CheckInventoryEntry(t) != nil {
			dropped++
			continue
		}
		out = append(out, &nodev1.TemplateInfo{TemplateId: t.GetTemplateId(), Version: t.GetVersion(), Digest: t.GetDigest()})
	}
	return out, dropped
}
