-- Flags tokens (OFREP evaluation, read-only, scoped like an agent token): a third kind.
-- SQLite cannot change a CHECK constraint in place, so the table is rebuilt with every
-- column and row as they are.
CREATE TABLE tokens_new (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL CHECK (kind IN ('api', 'agent', 'flags')),
    name        TEXT NOT NULL,
    role        TEXT,
    environment TEXT,
    services    TEXT NOT NULL DEFAULT '[]',
    created_by  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    revoked_at  BIGINT,
    person      TEXT
);
INSERT INTO tokens_new (id, kind, name, role, environment, services, created_by, created_at, expires_at, revoked_at, person)
    SELECT id, kind, name, role, environment, services, created_by, created_at, expires_at, revoked_at, person FROM tokens;
DROP TABLE tokens;
ALTER TABLE tokens_new RENAME TO tokens;
