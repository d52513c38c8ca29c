-- The network data path (issue 12). policy_drain_seconds: the drain_seconds
-- of the policy change that produced a Workspace's current policy revision,
-- sent to its node with the policy. exec_dns_version: the DNS configuration
-- version the node reported for the Workspace's execution (0: none reported,
-- an execution started by an earlier release). resources.drain_seconds: the
-- drain_seconds of the UpdateEgress that produced an Egress's current
-- revision (internal, never in the public object).
ALTER TABLE workspaces ADD COLUMN policy_drain_seconds BIGINT NOT NULL DEFAULT 600;
ALTER TABLE workspaces ADD COLUMN exec_dns_version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE resources ADD COLUMN drain_seconds BIGINT NOT NULL DEFAULT 600;
