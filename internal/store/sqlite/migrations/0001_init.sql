-- Initial schema of the SQLite dialect.
--
-- Timestamps are INTEGER microseconds since the Unix epoch, UTC (SQLite's
-- INTEGER is a 64-bit BIGINT). Tables are STRICT so a value of the wrong type
-- is an error rather than silently stored. Tables keyed by a composite key
-- are WITHOUT ROWID: the primary key is the clustered index.

CREATE TABLE secrets (
	name  TEXT NOT NULL PRIMARY KEY,
	value BLOB NOT NULL
) STRICT;

CREATE TABLE commands (
	command_id   TEXT    NOT NULL PRIMARY KEY,
	method       TEXT    NOT NULL,
	fingerprint  BLOB    NOT NULL,
	object_kind  TEXT    NOT NULL,
	object_id    TEXT    NOT NULL,
	kind         INTEGER NOT NULL,
	initiator    INTEGER NOT NULL,
	status       INTEGER NOT NULL,
	result       BLOB    NOT NULL,
	error_code   TEXT    NOT NULL,
	error_detail BLOB    NOT NULL,
	created_at   INTEGER NOT NULL,
	completed_at INTEGER            -- NULL while processing
) STRICT;

CREATE INDEX commands_object ON commands (object_kind, object_id, created_at);

CREATE TABLE resources (
	kind                 TEXT    NOT NULL,
	id                   TEXT    NOT NULL,
	created_at           INTEGER NOT NULL,
	updated_at           INTEGER NOT NULL,
	revision             INTEGER NOT NULL,
	spec                 BLOB    NOT NULL,
	labels_revision      INTEGER NOT NULL,
	annotations          TEXT    NOT NULL, -- JSON object of strings
	annotations_revision INTEGER NOT NULL,
	PRIMARY KEY (kind, id)
) STRICT, WITHOUT ROWID;

CREATE INDEX resources_list ON resources (kind, created_at, id);

-- Labels live only here. object_created_at repeats resources.created_at so
-- that a selector page is one range scan of labels_selector in list order.
CREATE TABLE labels (
	kind              TEXT    NOT NULL,
	object_id         TEXT    NOT NULL,
	key               TEXT    NOT NULL,
	value             TEXT    NOT NULL,
	object_created_at INTEGER NOT NULL,
	PRIMARY KEY (kind, object_id, key),
	FOREIGN KEY (kind, object_id) REFERENCES resources (kind, id) ON DELETE CASCADE
) STRICT, WITHOUT ROWID;

CREATE INDEX labels_selector ON labels (kind, key, value, object_created_at, object_id);

CREATE TABLE refs (
	workspace_id TEXT NOT NULL,
	ref_kind     TEXT NOT NULL,
	target_id    TEXT NOT NULL,
	PRIMARY KEY (ref_kind, target_id, workspace_id)
) STRICT, WITHOUT ROWID;

CREATE INDEX refs_workspace ON refs (workspace_id);
