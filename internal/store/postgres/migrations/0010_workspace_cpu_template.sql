-- Template versions and artifacts (issue 14).
--
-- cpu_millis (Resources.cpu_millis) and template_key ("<template_id>@<version>"
-- of the Workspace's TemplateRef, store.TemplateKey) are query columns
-- workspace.Save keeps equal to the document. The rows already stored get
-- theirs from their documents in Go (backfillWorkspaceCPUTemplate), in the
-- transaction that applies this file, as workspace_usage did.
-- workspaces_node_usage is rebuilt with cpu_millis so that NodeUsage keeps
-- being an index-only scan of it. workspaces_template holds the template
-- keys of the Workspaces whose deletion has not completed, for
-- CountWorkspacesWithTemplate.
ALTER TABLE workspaces ADD COLUMN cpu_millis BIGINT NOT NULL DEFAULT 0;
ALTER TABLE workspaces ADD COLUMN template_key TEXT NOT NULL DEFAULT '';
DROP INDEX workspaces_node_usage;
CREATE INDEX workspaces_node_usage ON workspaces (node_id) INCLUDE (power, memory_mib, layer_bytes, cpu_millis) WHERE deleted_at IS NULL;
CREATE INDEX workspaces_template ON workspaces (template_key) WHERE deleted_at IS NULL;

-- artifact_chunks holds artifacts' bytes (store.BlobTx), each chunk (up to
-- 4 MiB) starting at start_offset of its blob. data is stored out of line
-- without compression (EXTERNAL): its length is read without reading it,
-- and a chunk is written and read without a compression pass.
CREATE TABLE artifact_chunks (
	blob_id      TEXT   NOT NULL,
	start_offset BIGINT NOT NULL,
	data         BYTEA  NOT NULL,
	PRIMARY KEY (blob_id, start_offset)
);
ALTER TABLE artifact_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
