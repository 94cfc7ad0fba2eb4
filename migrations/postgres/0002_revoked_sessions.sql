-- Session tokens ended by "log out" before their expiry. A row is only needed until the
-- token would have expired anyway (expires_at, ms since the epoch); older rows are purged.
CREATE TABLE revoked_sessions (
    jti TEXT PRIMARY KEY,
    expires_at BIGINT NOT NULL
);
