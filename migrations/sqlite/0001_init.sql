-- Levee schema, SQLite flavour. Times are milliseconds since the Unix epoch (BIGINT);
-- booleans are BIGINT 0/1 on both backends (sqlx's Any driver maps no SQLite BOOLEAN).
CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE users (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    username      TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,
    role          TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    disabled      BIGINT NOT NULL DEFAULT 0,
    created_at    BIGINT NOT NULL
);

-- API and agent tokens; the JWT carries the id as `jti`, revocation is checked here.
CREATE TABLE tokens (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL CHECK (kind IN ('api', 'agent')),
    name        TEXT NOT NULL,
    role        TEXT,
    environment TEXT,
    services    TEXT NOT NULL DEFAULT '[]',
    created_by  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    revoked_at  BIGINT
);

CREATE TABLE environments (
    name         TEXT PRIMARY KEY,
    description  TEXT NOT NULL DEFAULT '',
    allow_faults BIGINT NOT NULL DEFAULT 0,
    created_at   BIGINT NOT NULL
);

-- `revision` is the per-service counter row: bumped inside the transaction of every change.
CREATE TABLE services (
    environment TEXT NOT NULL REFERENCES environments (name) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    revision    BIGINT NOT NULL DEFAULT 0,
    policy      TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (environment, name)
);

CREATE TABLE flags (
    environment TEXT NOT NULL,
    service     TEXT NOT NULL,
    key         TEXT NOT NULL,
    body        TEXT NOT NULL,
    expires_at  BIGINT,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (environment, service, key),
    FOREIGN KEY (environment, service) REFERENCES services (environment, name) ON DELETE CASCADE
);

CREATE TABLE faults (
    environment TEXT NOT NULL,
    service     TEXT NOT NULL,
    id          TEXT NOT NULL,
    body        TEXT NOT NULL,
    expires_at  BIGINT NOT NULL,
    PRIMARY KEY (environment, service, id),
    FOREIGN KEY (environment, service) REFERENCES services (environment, name) ON DELETE CASCADE
);

CREATE TABLE breaker_overrides (
    environment TEXT NOT NULL,
    service     TEXT NOT NULL,
    dependency  TEXT NOT NULL,
    operation   TEXT NOT NULL DEFAULT '',
    body        TEXT NOT NULL,
    expires_at  BIGINT,
    PRIMARY KEY (environment, service, dependency, operation),
    FOREIGN KEY (environment, service) REFERENCES services (environment, name) ON DELETE CASCADE
);

-- The full snapshot body of every revision, with its content hash: history, diff, rollback.
CREATE TABLE revisions (
    environment TEXT NOT NULL,
    service     TEXT NOT NULL,
    revision    BIGINT NOT NULL,
    hash        TEXT NOT NULL,
    body        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    actor       TEXT NOT NULL,
    reason      TEXT NOT NULL,
    PRIMARY KEY (environment, service, revision),
    FOREIGN KEY (environment, service) REFERENCES services (environment, name) ON DELETE CASCADE
);

-- Append-only audit log. No UPDATE or DELETE is ever issued against it.
CREATE TABLE audit (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at          BIGINT NOT NULL,
    actor       TEXT NOT NULL,
    via         TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    action      TEXT NOT NULL,
    environment TEXT,
    service     TEXT,
    target      TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    reason      TEXT NOT NULL,
    before      TEXT,
    after       TEXT,
    revision    BIGINT
);
CREATE INDEX audit_by_service ON audit (environment, service, at);
CREATE INDEX audit_by_actor ON audit (actor, at);

-- Live fleet state per agent instance (flushed in batches).
CREATE TABLE agents (
    environment      TEXT NOT NULL,
    service          TEXT NOT NULL,
    instance_id      TEXT NOT NULL,
    agent_version    TEXT NOT NULL,
    connected        BIGINT NOT NULL,
    connected_at     BIGINT NOT NULL,
    last_seen        BIGINT NOT NULL,
    applied_revision BIGINT NOT NULL,
    applied_hash     TEXT NOT NULL,
    status           TEXT,
    PRIMARY KEY (environment, service, instance_id)
);

-- Every NACK an agent sent: shown in the API/UI; a NACKed revision is not resent to it.
CREATE TABLE nacks (
    environment  TEXT NOT NULL,
    service      TEXT NOT NULL,
    instance_id  TEXT NOT NULL,
    revision     BIGINT NOT NULL,
    error_detail TEXT NOT NULL,
    at           BIGINT NOT NULL,
    PRIMARY KEY (environment, service, instance_id, revision)
);
