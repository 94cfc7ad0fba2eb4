-- When each agent acknowledged each revision pushed to it (ms since the epoch): the
-- propagation latency of a revision is acked_at minus the revision's created_at, per agent.
-- The first ACK of a revision by an instance is kept.
CREATE TABLE acks (
    environment TEXT NOT NULL,
    service     TEXT NOT NULL,
    revision    BIGINT NOT NULL,
    instance_id TEXT NOT NULL,
    acked_at    BIGINT NOT NULL,
    PRIMARY KEY (environment, service, revision, instance_id)
);
