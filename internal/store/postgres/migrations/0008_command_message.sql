-- Why ctrl started a command of its own (issue 13): commands.message is the
-- API's WorkspaceCommand.message, set when ctrl records a command it starts
-- (initiator EXPIRATION, HOST_MEMORY, GUEST_SHUTDOWN), '' for a caller's
-- command and for every command recorded before this change. It is written
-- once, with the command, and never updated. A constant default rewrites no
-- row.
ALTER TABLE commands ADD COLUMN message TEXT NOT NULL DEFAULT '';
