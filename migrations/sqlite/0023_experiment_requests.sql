-- Experiments are changes that approval rules can cover: a change request can propose one
-- (kind 'experiment'), and applying it starts it (experiment_id: the experiment started).
-- SQLite cannot change a CHECK constraint in place, so the table is rebuilt with every
-- column and row as they are.
CREATE TABLE change_requests_new (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    environment      TEXT NOT NULL REFERENCES environments (name) ON DELETE CASCADE,
    service          TEXT,
    kind             TEXT NOT NULL CHECK (kind IN ('flag', 'policy', 'profile', 'experiment')),
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
    outcome          TEXT,
    proposed_person  TEXT,
    experiment_id    BIGINT
);
INSERT INTO change_requests_new (id, environment, service, kind, target, payload, expected, base_revision, version,
    state, proposed_by, proposed_at, reason, approved_by, approved_at, approved_version, decided_reason, applied_by,
    applied_at, revision, outcome, proposed_person)
    SELECT id, environment, service, kind, target, payload, expected, base_revision, version,
    state, proposed_by, proposed_at, reason, approved_by, approved_at, approved_version, decided_reason, applied_by,
    applied_at, revision, outcome, proposed_person FROM change_requests;
DROP TABLE change_requests;
ALTER TABLE change_requests_new RENAME TO change_requests;
CREATE INDEX change_requests_by_env ON change_requests (environment, state);
