-- Workspaces and nodes.
--
-- Constants that partial indexes test (8 = WORKSPACE_STATE_DELETED, 1 =
-- CommandProcessing, '' = unplaced) are spelled as literals both here and in
-- the store's statements: SQLite uses a partial index only when the query's
-- WHERE clause contains the index's terms as written.

-- labels also holds the labels of Workspaces (kind 'workspace'), which are
-- not rows of resources, so it is rebuilt without its foreign key to
-- resources (SQLite cannot drop a constraint). The store deletes a
-- resource's labels itself, as DeleteResource always did.
CREATE TABLE labels_new (
	kind              TEXT    NOT NULL,
	object_id         TEXT    NOT NULL,
	key               TEXT    NOT NULL,
	value             TEXT    NOT NULL,
	object_created_at INTEGER NOT NULL, -- the object's created_at
	PRIMARY KEY (kind, object_id, key)
) STRICT, WITHOUT ROWID;

INSERT INTO labels_new (kind, object_id, key, value, object_created_at)
	SELECT kind, object_id, key, value, object_created_at FROM labels;

DROP TABLE labels;

ALTER TABLE labels_new RENAME TO labels;

CREATE INDEX labels_selector ON labels (kind, key, value, object_created_at, object_id);

-- A rowid table (not WITHOUT ROWID): doc is an encoded Workspace of a few
-- kilobytes, too large a row for a clustered primary key.
CREATE TABLE workspaces (
	id                  TEXT    NOT NULL PRIMARY KEY,
	created_at          INTEGER NOT NULL,
	updated_at          INTEGER NOT NULL,
	deleted_at          INTEGER,          -- NULL until the deletion completed
	doc                 BLOB    NOT NULL,
	state               INTEGER NOT NULL, -- WorkspaceState
	guest_condition     INTEGER NOT NULL, -- 0 when none
	node_id             TEXT    NOT NULL, -- '' while unplaced
	power               INTEGER NOT NULL,
	force_stop          INTEGER NOT NULL CHECK (force_stop IN (0, 1)),
	generation          INTEGER NOT NULL,
	command_id          TEXT    NOT NULL,
	observed_generation INTEGER NOT NULL,
	observed_state      INTEGER NOT NULL,
	holds_execution     INTEGER NOT NULL CHECK (holds_execution IN (0, 1)),
	observed_at         INTEGER           -- NULL before the first report
) STRICT;

-- Listing with deleted Workspaces included.
CREATE INDEX workspaces_list ON workspaces (created_at, id);
-- The default listing: deleted Workspaces left out without reading them.
CREATE INDEX workspaces_live ON workspaces (created_at, id) WHERE state != 8;
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
	id            TEXT    NOT NULL PRIMARY KEY,
	created_at    INTEGER NOT NULL,
	last_seen     INTEGER NOT NULL,
	memory_mib    INTEGER NOT NULL,
	cpu_millis    INTEGER NOT NULL,
	storage_bytes INTEGER NOT NULL,
	doc           BLOB    NOT NULL
) STRICT;
