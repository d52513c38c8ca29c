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

// NodeTx are the node operations of a transaction.
type NodeTx interface {
	// UpsertNode creates or replaces a node.
	UpsertNode(ctx context.Context, n *Node) error
	// GetNode returns a node; ErrNotFound when absent.
	GetNode(ctx context.Context, id string) (*Node, error)
	// ListNodes returns every node, by ID.
	ListNodes(ctx context.Context) ([]*Node, error)
	// DenyNodeKey records a denied key. Denying a key that is denied
	// already changes nothing: the first record stays.
	DenyNodeKey(ctx context.Context, k *DeniedNodeKey) error
	// GetDeniedNodeKey returns the record of a denied key; ErrNotFound when
	// the key is not denied.
	GetDeniedNodeKey(ctx context.Context, keyHash []byte) (*DeniedNodeKey, error)
}
