-- What a Workspace asks of its node (issue 13): memory_mib
-- (Resources.memory_mib) and layer_bytes (WritableLayer.capacity_bytes);
-- workspace.Save keeps them equal to the document. The rows already stored
-- get theirs from their documents, which SQL cannot read: the store's
-- migrate fills them in Go (backfillWorkspaceUsage) in the transaction
-- that applies this file. workspaces_node_usage covers NodeUsage, the sums
-- placement and the storage-pool accounting read for a node, so that they
-- never read the node's documents. deleted_at, always NULL in it, is in
-- the index so that SQLite's planner finds every column the query names
-- there and never reads the table.
ALTER TABLE workspaces ADD COLUMN memory_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workspaces ADD COLUMN layer_bytes INTEGER NOT NULL DEFAULT 0;
CREATE INDEX workspaces_node_usage ON workspaces (node_id, power, memory_mib, layer_bytes, deleted_at) WHERE deleted_at IS NULL;
