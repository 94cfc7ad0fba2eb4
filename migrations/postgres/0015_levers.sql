-- The operator levers a service has for a limited time (an emergency profile's shed
-- percentage, paused retries, fixed inbound limit): one row per service at most, its body
-- the snapshot's `levers` (JSON), removed by the expiry sweep at `expires_at` (ms since
-- the epoch).
CREATE TABLE levers (
    environment TEXT NOT NULL,
    service     TEXT NOT NULL,
    body        TEXT NOT NULL,
    expires_at  BIGINT NOT NULL,
    PRIMARY KEY (environment, service),
    FOREIGN KEY (environment, service) REFERENCES services (environment, name) ON DELETE CASCADE
);
