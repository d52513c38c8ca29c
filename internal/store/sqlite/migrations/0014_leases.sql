-- Leases (issue 15): one row per named piece of fleet-wide work that exactly
-- one ctrl replica may do at a time (internal/lease). holder is the replica
-- holding it ('' for none yet), fence increases at every change of holder,
-- expires_at (microseconds, as every timestamp) ends the holder's claim
-- unless it renews.
CREATE TABLE leases (
	name       TEXT    PRIMARY KEY,
	holder     TEXT    NOT NULL,
	fence      INTEGER NOT NULL,
	expires_at INTEGER NOT NULL
);
