-- Node connection epochs and record revisions (issue 15). epoch increases
-- at every Hello (the registering transaction of a node's stream), so that
-- the writes of a stream older than the node's latest one are refused;
-- revision increases at every UpsertNode (not on the last_seen writes of
-- heartbeats), so that a replica re-reads only the node records that changed.
ALTER TABLE nodes ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;
