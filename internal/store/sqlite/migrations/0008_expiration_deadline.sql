-- Expirations (issue 13). expiration_deadline: when a Workspace's armed
-- expiration falls due, in microseconds since the Unix epoch (rounded up),
-- NULL when none is armed; workspace.Save keeps it equal to the document.
-- No backfill: earlier releases refused every expiration, so none is armed.
-- workspaces_expiration holds the armed deadlines only, in firing order: the
-- expiration engine reads the due ones and the next one from it, never the
-- whole table.
ALTER TABLE workspaces ADD COLUMN expiration_deadline INTEGER;
CREATE INDEX workspaces_expiration ON workspaces (expiration_deadline, id) WHERE expiration_deadline IS NOT NULL;
