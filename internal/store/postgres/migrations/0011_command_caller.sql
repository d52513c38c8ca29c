-- Who sent a command (issue 15): commands.caller is the API's
-- WorkspaceCommand.caller and VolumeCommand.caller, the subject of the
-- caller's Operator certificate (RFC 4514, at most 1 KiB), '' for a command
-- ctrl started itself and for every command recorded before this change. It
-- is written once, with the command, and never updated. A constant default
-- rewrites no row.
ALTER TABLE commands ADD COLUMN caller TEXT NOT NULL DEFAULT '';
