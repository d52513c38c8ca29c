-- workspaces_pending held Workspaces whose placement failed and that wait for
-- a new command (node_id = '' and command_id = ''). The reconciler skips
-- them, but they still filled its page of pending Workspaces: enough of them
-- could starve real work. They leave the index; PendingWorkspaces repeats
-- its predicate.
DROP INDEX workspaces_pending;
CREATE INDEX workspaces_pending ON workspaces (created_at, id)
	WHERE deleted_at IS NULL AND (generation > observed_generation OR node_id = '')
		AND (node_id != '' OR command_id != '');
