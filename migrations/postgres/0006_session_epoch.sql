-- A user's session epoch: every session carries the epoch it was opened at, and changing
-- the user's password or role bumps it, which ends every session the user had open.
ALTER TABLE users ADD COLUMN session_epoch BIGINT NOT NULL DEFAULT 0;
