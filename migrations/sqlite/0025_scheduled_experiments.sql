-- Experiments can be scheduled: a scheduled change of kind 'experiment' starts one when due
-- (experiment_id: the experiment it started, set in the transaction that records it, so a
-- run taken over after its replica died never starts a second one).
-- SQLite cannot change a CHECK constraint in place, so the table is rebuilt with every
-- column and row as they are.
CREATE TABLE scheduled_changes_new (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    environment      TEXT NOT NULL REFERENCES environments (name) ON DELETE CASCADE,
    service          TEXT,
    kind             TEXT NOT NULL CHECK (kind IN ('flag', 'policy', 'profile', 'experiment')),
    target           TEXT NOT NULL,
    payload          TEXT NOT NULL,
    expected         TEXT,
    base_revision    BIGINT,
    run_at           BIGINT NOT NULL,
    revert_at        BIGINT,
    reverts          BIGINT,
    state            TEXT NOT NULL CHECK (state IN ('pending', 'running', 'applied', 'conflict', 'failed', 'cancelled')),
    created_by       TEXT NOT NULL,
    created_role     TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    reason           TEXT NOT NULL,
    claimed_by       TEXT,
    finished_at      BIGINT,
    outcome          TEXT,
    revision         BIGINT,
    claim_expires_at BIGINT,
    created_user     TEXT,
    created_token    TEXT,
    break_glass      TEXT,
    experiment_id    BIGINT
);
INSERT INTO scheduled_changes_new (id, environment, service, kind, target, payload, expected, base_revision, run_at,
    revert_at, reverts, state, created_by, created_role, created_at, reason, claimed_by, finished_at, outcome,
    revision, claim_expires_at, created_user, created_token, break_glass)
    SELECT id, environment, service, kind, target, payload, expected, base_revision, run_at,
    revert_at, reverts, state, created_by, created_role, created_at, reason, claimed_by, finished_at, outcome,
    revision, claim_expires_at, created_user, created_token, break_glass FROM scheduled_changes;
DROP TABLE scheduled_changes;
ALTER TABLE scheduled_changes_new RENAME TO scheduled_changes;
CREATE INDEX scheduled_changes_due ON scheduled_changes (state, run_at);
