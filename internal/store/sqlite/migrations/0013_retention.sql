-- Retention (issue 15): internal/retention prunes completed commands, and
-- Workspaces whose deletion completed, once they are older than the
-- configured retention, in bounded batches. These partial indexes let each
-- batch find its rows without scanning the tables: the oldest completed
-- commands (1 = CommandProcessing and 2 = CommandCompleted are spelled as
-- literals, as in the store's statements), the Workspaces that still name a
-- command (a pruned command must not be one of them), and the oldest
-- deletions.
CREATE INDEX commands_completed ON commands (completed_at) WHERE status = 2;
CREATE INDEX workspaces_command ON workspaces (command_id) WHERE command_id != '';
CREATE INDEX workspaces_deleted ON workspaces (deleted_at) WHERE deleted_at IS NOT NULL;
