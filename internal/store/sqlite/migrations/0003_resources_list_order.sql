-- Resources stored in list order, with their labels.
--
-- resources was clustered by (kind, id). IDs are random, so a page of a
-- list, consecutive in (created_at, id), was as many rows scattered over as
-- many pages of the table, and reading their labels was again one probe of
-- the labels primary key per resource, each on another page: about two
-- hundred pages read for a page of 100, most of them missing the page cache
-- once the table is large.
--
-- resources is rebuilt clustered by its list order, (kind, created_at, id):
-- a list page, with or without a selector, reads consecutive rows. The
-- UNIQUE index resources_id keeps an ID unique within its kind and finds a
-- resource by ID (its entries hold created_at: the primary key). The list
-- index resources_list is now the table itself.
--
-- The labels of a resource are also kept in the row, as the JSON object
-- labels, so that a page and a get read no other table. The labels table
-- still holds every label, for selectors (labels_selector) and for the
-- labels of Workspaces; the store writes both copies in the same
-- transaction (InsertResource, UpdateResource, DeleteResource).

CREATE TABLE resources_new (
	kind                 TEXT    NOT NULL,
	id                   TEXT    NOT NULL,
	created_at           INTEGER NOT NULL,
	updated_at           INTEGER NOT NULL,
	revision             INTEGER NOT NULL,
	spec                 BLOB    NOT NULL,
	labels               TEXT    NOT NULL, -- JSON object of strings, as in labels
	labels_revision      INTEGER NOT NULL,
	annotations          TEXT    NOT NULL, -- JSON object of strings
	annotations_revision INTEGER NOT NULL,
	PRIMARY KEY (kind, created_at, id)
) STRICT, WITHOUT ROWID;

INSERT INTO resources_new (kind, id, created_at, updated_at, revision, spec, labels,
		labels_revision, annotations, annotations_revision)
	SELECT r.kind, r.id, r.created_at, r.updated_at, r.revision, r.spec,
		coalesce((SELECT json_group_object(l.key, l.value) FROM labels l
			WHERE l.kind = r.kind AND l.object_id = r.id), '{}'),
		r.labels_revision, r.annotations, r.annotations_revision
	FROM resources r
	ORDER BY r.kind, r.created_at, r.id;

-- Also drops resources_list.
DROP TABLE resources;

ALTER TABLE resources_new RENAME TO resources;

CREATE UNIQUE INDEX resources_id ON resources (kind, id);
