-- Experiments: a fault injected into some instances of a service for a duration, with a
-- steady-state hypothesis measured before, during and after. One row per run; the run's
-- replica records each reading (and its sign of life, heartbeat_at), so another replica
-- can end a run whose replica died.
CREATE TABLE experiments (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    environment        TEXT NOT NULL REFERENCES environments (name) ON DELETE CASCADE,
    service            TEXT NOT NULL,
    name               TEXT NOT NULL,
    spec               TEXT NOT NULL,
    state              TEXT NOT NULL CHECK (state IN ('baseline', 'injected', 'recovery', 'done')),
    verdict            TEXT CHECK (verdict IN ('passed', 'failed', 'aborted')),
    why                TEXT,
    instances          TEXT,
    created_by         TEXT NOT NULL,
    created_role       TEXT NOT NULL,
    created_at         BIGINT NOT NULL,
    reason             TEXT NOT NULL,
    injected_at        BIGINT,
    fault_expires_at   BIGINT,
    fault_removed_at   BIGINT,
    ended_at           BIGINT,
    stop_requested_by  TEXT,
    stop_requested_at  BIGINT,
    stop_reason        TEXT,
    replica            TEXT NOT NULL,
    heartbeat_at       BIGINT NOT NULL
);
CREATE INDEX experiments_by_service ON experiments (environment, service, id);
CREATE INDEX experiments_running ON experiments (state, heartbeat_at);

CREATE TABLE experiment_readings (
    experiment_id  BIGINT NOT NULL REFERENCES experiments (id) ON DELETE CASCADE,
    at             BIGINT NOT NULL,
    phase          TEXT NOT NULL CHECK (phase IN ('baseline', 'injected', 'recovery')),
    reading        TEXT NOT NULL
);
CREATE INDEX experiment_readings_by_experiment ON experiment_readings (experiment_id, at);
