-- Agents' health windows summed per replica, environment, service, revision (the one the
-- agents had applied), 10-second slot and subject (a dependency or an inbound route;
-- kind and name empty: the slot's instance counts). Written by each replica's health
-- flusher every few seconds, a row replaced as its slot fills, never per report;
-- readers sum the replicas. Rows older than the retention are deleted by the flusher.
CREATE TABLE health_windows (
    replica       TEXT   NOT NULL,
    environment   TEXT   NOT NULL,
    service       TEXT   NOT NULL,
    revision      BIGINT NOT NULL,
    slot_ms       BIGINT NOT NULL,
    kind          TEXT   NOT NULL,
    name          TEXT   NOT NULL,
    calls         BIGINT NOT NULL,
    successes     BIGINT NOT NULL,
    failures      BIGINT NOT NULL,
    timeouts      BIGINT NOT NULL,
    fallbacks     BIGINT NOT NULL,
    shed          BIGINT NOT NULL,
    breaker_opens BIGINT NOT NULL,
    latency       TEXT   NOT NULL,
    instances     BIGINT NOT NULL,
    not_ready     BIGINT NOT NULL,
    PRIMARY KEY (replica, environment, service, revision, slot_ms, kind, name)
);
CREATE INDEX health_windows_service_slot ON health_windows (environment, service, slot_ms);
CREATE INDEX health_windows_slot ON health_windows (slot_ms);
