package store

import (
	"context"
	"time"
)

// Node is a registered node.
type Node struct {
	ID           string
	CreatedAt    time.Time
	LastSeen     time.Time
	MemoryMiB    uint64 // capacity
	CPUMillis    uint64
	StorageBytes uint64
	Doc          []byte // encoded details, opaque to the store
	// CertKeyHash is the SHA-256 of the public key (PKIX) of the node
	// certificate issued at the node's latest enrollment; empty for a node
	// whose certificate was issued by hand. Only that key may connect.
	CertKeyHash []byte
	// Epoch is the node's connection epoch: the registering transaction of
	// each Hello stores the previous value plus one, and every write a
	// stream makes afterwards (Store.TouchNodes, an Inventory, a report)
	// checks it, so a
	// stream that a newer one superseded — on this replica or another —
	// writes nothing. UpsertNode stores it as given.
	Epoch int64
	// Revision is set by the store: it increases by one at every
	// UpsertNode of the node (1 when created) and never on TouchNodes, so
	// a replica re-reads the documents of only the nodes whose revision
	// changed (NodeStates). UpsertNode ignores the value given.
	Revision int64
}

// NodeState is what NodeStates reads of each node: no document, so that
// reading every node's liveness and revision stays cheap at thousands of
// nodes.
type NodeState struct {
	ID       string
	LastSeen time.Time
	Epoch    int64
	Revision int64
}

// DeniedNodeKey is a node certificate key that may no longer speak for any
// node: NodeService refuses its connections and CertificateService its
// renewals, whatever the certificate presenting it says. Keys, not
// certificates, are denied because renewals keep the key: every certificate
// ever issued for it is shut out at once, those issued by hand included.
type DeniedNodeKey struct {
	// KeyHash is the SHA-256 of the public key (PKIX), as
	// pki.PublicKeyHash computes it; the primary key.
	KeyHash []byte
	// NodeID is the node the key spoke for, for the record.
	NodeID   string
	DeniedAt time.Time
	// Reason says why, for operators; never a secret.
	Reason string
}

// NodeTouch is one node heard by a stream, for Store.TouchNodes.
type NodeTouch struct {
	ID    string
	Epoch int64     // the connection epoch of the stream that heard it
	Seen  time.Time // when that stream last heard it
}

// NodeTx are the node operations of a transaction.
type NodeTx interface {
	// UpsertNode creates or replaces a node.
	UpsertNode(ctx context.Context, n *Node) error
	// GetNode returns a node; ErrNotFound when absent.
	GetNode(ctx context.Context, id string) (*Node, error)
	// ListNodes returns every node, by ID.
	ListNodes(ctx context.Context) ([]*Node, error)
	// NodeStates returns every node's ID, last_seen, epoch and revision,
	// by ID: one query, no document.
	NodeStates(ctx context.Context) ([]NodeState, error)
	// NodeEpoch returns the stored connection epoch of node id (reading
	// nothing else of it); ErrNotFound when absent. A report's transaction
	// checks it, so a superseded stream's report writes nothing.
	NodeEpoch(ctx context.Context, id string) (int64, error)
	// DenyNodeKey records a denied key. Denying a key that is denied
	// already changes nothing: the first record stays.
	DenyNodeKey(ctx context.Context, k *DeniedNodeKey) error
	// GetDeniedNodeKey returns the record of a denied key; ErrNotFound when
	// the key is not denied.
	GetDeniedNodeKey(ctx context.Context, keyHash []byte) (*DeniedNodeKey, error)
}
