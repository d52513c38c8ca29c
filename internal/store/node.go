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

// NodeTx are the node operations of a transaction.
type NodeTx interface {
	// UpsertNode creates or replaces a node.
	UpsertNode(ctx context.Context, n *Node) error
	// GetNode returns a node; ErrNotFound when absent.
	GetNode(ctx context.Context, id string) (*Node, error)
	// ListNodes returns every node, by ID.
	ListNodes(ctx context.Context) ([]*Node, error)
}
