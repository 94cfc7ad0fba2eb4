-- Scheduled changes: a flag value, a policy or a profile application due at a time, with an
-- optional automatic revert (itself a scheduled change). Stored, so they survive a restart;
-- a due change is claimed with a conditional UPDATE (state 'pending' → 'running'), so with
-- several replicas exactly one applies it.
CREATE TABLE scheduled_changes (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    environment    TEXT NOT NULL REFERENCES environments (name) ON DELETE CASCADE,
    service        TEXT,
    kind           TEXT NOT NULL CHECK (kind IN ('flag', 'policy', 'profile')),
    target         TEXT NOT NULL,
    payload        TEXT NOT NULL,
    expected       TEXT,
    base_revision  BIGINT,
    run_at         BIGINT NOT NULL,
    revert_at      BIGINT,
    reverts        BIGINT,
    state          TEXT NOT NULL CHECK (state IN ('pending', 'running', 'applied', 'conflict', 'failed', 'cancelled')),
    created_by     TEXT NOT NULL,
    created_role   TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    reason         TEXT NOT NULL,
    claimed_by     TEXT,
    finished_at    BIGINT,
    outcome        TEXT,
    revision       BIGINT
);
CREATE INDEX scheduled_changes_due ON scheduled_changes (state, run_at);

-- Four-eyes: per environment, the kinds of change ('policy', 'flag', 'profile') that need
-- an approved change request (a JSON array), set by an admin.
CREATE TABLE approval_rules (
    environment TEXT PRIMARY KEY REFERENCES environments (name) ON DELETE CASCADE,
    kinds       TEXT NOT NULL,
    updated_at  BIGINT NOT NULL,
    updated_by  TEXT NOT NULL
);

-- Change requests: a proposed change, the target as the proposer saw it, and its review.
-- `version` is bumped by every edit; an approval records the version it approved, so an
-- edit after approval voids it, and what is applied is exactly what was approved.
CREATE TABLE change_requests (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    environment      TEXT NOT NULL REFERENCES environments (name) ON DELETE CASCADE,
    service          TEXT,
    kind             TEXT NOT NULL CHECK (kind IN ('flag', 'policy', 'profile')),
    target           TEXT NOT NULL,
    payload          TEXT NOT NULL,
    expected         TEXT,
    base_revision    BIGINT,
    version          BIGINT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('open', 'approved', 'applied', 'rejected', 'conflict')),
    proposed_by      TEXT NOT NULL,
    proposed_at      BIGINT NOT NULL,
    reason           TEXT NOT NULL,
    approved_by      TEXT,
    approved_at      BIGINT,
    approved_version BIGINT,
    decided_reason   TEXT,
    applied_by       TEXT,
    applied_at       BIGINT,
    revision         BIGINT,
    outcome          TEXT
);
CREATE INDEX change_requests_by_env ON change_requests (environment, state);
