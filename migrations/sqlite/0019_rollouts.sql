-- Staged rollouts: a change delivered to a cohort of a service's instances first, while the
-- rest keeps the previous revision. Stored, so a restart or another replica resumes it at
-- its stage. `stable_revision` is what instances outside the cohort are served,
-- `candidate_revision` what the cohort is served (both move forward together when an
-- immediate change, such as a flag flip, is written during the rollout). `threshold` is the
-- cohort of the current stage in rollout buckets (levee_agent::flags::rollout_bucket of the
-- instance id): an instance is in it when its bucket is below.
CREATE TABLE rollouts (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    environment        TEXT NOT NULL REFERENCES environments (name) ON DELETE CASCADE,
    service            TEXT NOT NULL,
    state              TEXT NOT NULL CHECK (state IN ('running', 'paused', 'halted', 'aborted', 'completed')),
    stable_revision    BIGINT NOT NULL,
    candidate_revision BIGINT NOT NULL,
    base_policy        TEXT NOT NULL,
    plan               TEXT NOT NULL,
    stage              BIGINT NOT NULL,
    threshold          BIGINT NOT NULL,
    stage_started_at   BIGINT NOT NULL,
    version            BIGINT NOT NULL,
    created_at         BIGINT NOT NULL,
    created_by         TEXT NOT NULL,
    reason             TEXT NOT NULL,
    ended_at           BIGINT,
    outcome            TEXT,
    revert_revision    BIGINT
);
-- At most one rollout in progress per service.
CREATE UNIQUE INDEX rollouts_one_active ON rollouts (environment, service) WHERE state IN ('running', 'paused');
CREATE INDEX rollouts_by_service ON rollouts (environment, service, id);

-- Per environment: which kinds of change are staged by default, and the default plan
-- (stages, bake time, halt thresholds), as JSON; no row = every change is immediate.
CREATE TABLE rollout_settings (
    environment TEXT PRIMARY KEY REFERENCES environments (name) ON DELETE CASCADE,
    body        TEXT NOT NULL,
    updated_at  BIGINT NOT NULL,
    updated_by  TEXT NOT NULL
);
