-- Emergency profiles: named, pre-agreed sets of overrides per environment, versioned like
-- policies (every version kept), applied or reverted in one action.
CREATE TABLE profiles (
    environment TEXT NOT NULL REFERENCES environments (name) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    version     BIGINT NOT NULL,
    body        TEXT NOT NULL,
    updated_at  BIGINT NOT NULL,
    updated_by  TEXT NOT NULL,
    PRIMARY KEY (environment, name)
);

CREATE TABLE profile_versions (
    environment TEXT NOT NULL,
    name        TEXT NOT NULL,
    version     BIGINT NOT NULL,
    body        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    actor       TEXT NOT NULL,
    reason      TEXT NOT NULL,
    PRIMARY KEY (environment, name, version)
);

-- One row per application of a profile. `saved` holds, per service, what each entry the
-- profile set replaced, so a revert restores it. At most one active (not reverted) row per
-- environment; a revert is claimed by a conditional UPDATE, so one replica does it.
CREATE TABLE profile_activations (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    environment   TEXT NOT NULL REFERENCES environments (name) ON DELETE CASCADE,
    profile       TEXT NOT NULL,
    version       BIGINT NOT NULL,
    applied_at    BIGINT NOT NULL,
    applied_by    TEXT NOT NULL,
    reason        TEXT NOT NULL,
    expires_at    BIGINT NOT NULL,
    saved         TEXT NOT NULL,
    reverted_at   BIGINT,
    reverted_by   TEXT,
    revert_reason TEXT
);
CREATE UNIQUE INDEX profile_activations_one_active ON profile_activations (environment)
    WHERE reverted_at IS NULL;
