-- Workspaces and nodes.
--
-- Workspace labels live in labels with kind 'workspace' (labels has no
-- foreign key, see 0001), object_created_at = workspaces.created_at.
--
-- Constants that partial indexes test (8 = WORKSPACE_STATE_DELETED, 1 =
-- CommandProcessing, '' = unplaced) are spelled as literals both here and in
-- the store's statements, so that the planner proves a query implies the
-- index's predicate in generic plans too, where parameters are unknown.

CREATE TABLE workspaces (
	id                  TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	created_at          BIGINT  NOT NULL,
	updated_at          BIGINT  NOT NULL,
	deleted_at          BIGINT,           -- NULL until the deletion completed
	doc                 BYTEA   NOT NULL,
	state               INTEGER NOT NULL, -- WorkspaceState
	guest_condition     INTEGER NOT NULL, -- 0 when none
	node_id             TEXT COLLATE "C" NOT NULL, -- '' while unplaced
	power               INTEGER NOT NULL,
	force_stop          BOOLEAN NOT NULL,
	generation          BIGINT  NOT NULL,
	command_id          TEXT COLLATE "C" NOT NULL,
	observed_generation BIGINT  NOT NULL,
	observed_state      INTEGER NOT NULL,
	holds_execution     BOOLEAN NOT NULL,
	observed_at         BIGINT            -- NULL before the first report
) WITH (fillfactor = 80); -- room for HOT updates: the reconciler updates often

-- Listing with deleted Workspaces included.
CREATE INDEX workspaces_list ON workspaces (created_at, id);
-- The default listing: deleted Workspaces left out without reading them.
CREATE INDEX workspaces_live ON workspaces (created_at, id) WHERE state <> 8;
-- A states filter: one range scan per state, each already in list order.
CREATE INDEX workspaces_state ON workspaces (state, created_at, id);
-- A guest condition filter (a rare condition such as UNRESPONSIVE must not
-- cost a scan of every Workspace).
CREATE INDEX workspaces_guest ON workspaces (guest_condition, created_at, id);
-- WorkspacesOnNode.
CREATE INDEX workspaces_node ON workspaces (node_id, created_at, id) WHERE deleted_at IS NULL;
-- PendingWorkspaces: only the Workspaces the reconciler has work for.
CREATE INDEX workspaces_pending ON workspaces (created_at, id)
	WHERE deleted_at IS NULL AND (generation > observed_generation OR node_id = '');

-- ProcessingCommands: only the commands still processing.
CREATE INDEX commands_processing ON commands (object_kind, created_at, command_id) WHERE status = 1;

CREATE TABLE nodes (
	id            TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	created_at    BIGINT NOT NULL,
	last_seen     BIGINT NOT NULL,
	memory_mib    BIGINT NOT NULL,
	cpu_millis    BIGINT NOT NULL,
	storage_bytes BIGINT NOT NULL,
	doc           BYTEA  NOT NULL
);
