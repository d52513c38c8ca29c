-- Initial schema of the PostgreSQL dialect.
--
-- Timestamps are BIGINT microseconds since the Unix epoch, UTC. Key columns
-- use the "C" collation so that ORDER BY and keyset comparisons are bytewise,
-- as in Go and in the SQLite dialect, whatever the database's locale.

CREATE TABLE secrets (
	name  TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	value BYTEA NOT NULL
);

CREATE TABLE commands (
	command_id   TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	method       TEXT     NOT NULL,
	fingerprint  BYTEA    NOT NULL,
	object_kind  TEXT COLLATE "C" NOT NULL,
	object_id    TEXT COLLATE "C" NOT NULL,
	kind         INTEGER  NOT NULL,
	initiator    INTEGER  NOT NULL,
	status       SMALLINT NOT NULL,
	result       BYTEA    NOT NULL,
	error_code   TEXT     NOT NULL,
	error_detail BYTEA    NOT NULL,
	created_at   BIGINT   NOT NULL,
	completed_at BIGINT             -- NULL while processing
);

CREATE INDEX commands_object ON commands (object_kind, object_id, created_at);

CREATE TABLE resources (
	kind                 TEXT COLLATE "C" NOT NULL,
	id                   TEXT COLLATE "C" NOT NULL,
	created_at           BIGINT NOT NULL,
	updated_at           BIGINT NOT NULL,
	revision             BIGINT NOT NULL,
	spec                 BYTEA  NOT NULL,
	labels_revision      BIGINT NOT NULL,
	annotations          TEXT   NOT NULL, -- JSON object of strings
	annotations_revision BIGINT NOT NULL,
	PRIMARY KEY (kind, id)
);

CREATE INDEX resources_list ON resources (kind, created_at, id);

-- Labels live only here. object_created_at repeats resources.created_at so
-- that a selector page is one range scan of labels_selector in list order.
-- There is deliberately no foreign key to resources (the store deletes a
-- resource's labels with it): under SERIALIZABLE the foreign key check reads
-- resources_pkey, and its SSI predicate lock on the index page makes
-- concurrent inserts of neighbouring resources abort each other.
CREATE TABLE labels (
	kind              TEXT COLLATE "C" NOT NULL,
	object_id         TEXT COLLATE "C" NOT NULL,
	key               TEXT COLLATE "C" NOT NULL,
	value             TEXT COLLATE "C" NOT NULL,
	object_created_at BIGINT NOT NULL,
	PRIMARY KEY (kind, object_id, key)
);

CREATE INDEX labels_selector ON labels (kind, key, value, object_created_at, object_id);

CREATE TABLE refs (
	workspace_id TEXT COLLATE "C" NOT NULL,
	ref_kind     TEXT COLLATE "C" NOT NULL,
	target_id    TEXT COLLATE "C" NOT NULL,
	PRIMARY KEY (ref_kind, target_id, workspace_id)
);

CREATE INDEX refs_workspace ON refs (workspace_id);
