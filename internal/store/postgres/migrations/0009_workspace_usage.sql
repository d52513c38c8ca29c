-- What a Workspace asks of its node (issue 13): memory_mib
-- (Resources.memory_mib) and layer_bytes (WritableLayer.capacity_bytes);
-- workspace.Save keeps them equal to the document. The rows already stored
-- get theirs from their documents, which SQL cannot read: the store's
-- migrate fills them in Go (backfillWorkspaceUsage) in the transaction
-- that applies this file. workspaces_node_usage covers NodeUsage, the sums
-- placement and the storage-pool accounting read for a node, so that they
-- never read the node's documents.
ALTER TABLE workspaces ADD COLUMN memory_mib BIGINT NOT NULL DEFAULT 0;
ALTER TABLE workspaces ADD COLUMN layer_bytes BIGINT NOT NULL DEFAULT 0;
CREATE INDEX workspaces_node_usage ON workspaces (node_id) INCLUDE (power, memory_mib, layer_bytes) WHERE deleted_at IS NULL;
