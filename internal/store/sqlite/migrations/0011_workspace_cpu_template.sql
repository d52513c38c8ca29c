-- Template versions and artifacts (issue 14).
--
-- cpu_millis (Resources.cpu_millis) and template_key ("<template_id>@<version>"
-- of the Workspace's TemplateRef, store.TemplateKey) are query columns
-- workspace.Save keeps equal to the document. The rows already stored get
-- theirs from their documents in Go (backfillWorkspaceCPUTemplate), in the
-- transaction that applies this file, as workspace_usage did.
-- workspaces_node_usage is rebuilt with cpu_millis so that NodeUsage keeps
-- reading only it. workspaces_template holds the template keys of the
-- Workspaces whose deletion has not completed, for
-- CountWorkspacesWithTemplate; deleted_at, always NULL in both, is in them
-- so that SQLite's planner finds every column the queries name there.
ALTER TABLE workspaces ADD COLUMN cpu_millis INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workspaces ADD COLUMN template_key TEXT NOT NULL DEFAULT '';
DROP INDEX workspaces_node_usage;
CREATE INDEX workspaces_node_usage ON workspaces (node_id, power, memory_mib, layer_bytes, cpu_millis, deleted_at) WHERE deleted_at IS NULL;
CREATE INDEX workspaces_template ON workspaces (template_key, deleted_at) WHERE deleted_at IS NULL;

-- artifact_chunks holds artifacts' bytes (store.BlobTx), each chunk (up to
-- 4 MiB) starting at start_offset of its blob. A rowid table: its rows are
-- large, and the primary key's own index finds a read's chunks without
-- reading their bytes.
CREATE TABLE artifact_chunks (
	blob_id      TEXT    NOT NULL,
	start_offset INTEGER NOT NULL,
	data         BLOB    NOT NULL,
	PRIMARY KEY (blob_id, start_offset)
) STRICT;
