-- What a flag is put back to when a temporary value expires: a write that gives an
-- expiry to a flag that had none (`levee flip … --for 30m`) keeps the flag as it was here,
-- and the expiry sweep restores it in the revision that removes the temporary value
-- (server-side only; agents never receive it). Every later write of the flag keeps (still
-- temporary), or drops (permanent value, deleted) the row, in the same transaction.
CREATE TABLE flag_restores (
    environment TEXT NOT NULL,
    service     TEXT NOT NULL,
    key         TEXT NOT NULL,
    body        TEXT NOT NULL,
    PRIMARY KEY (environment, service, key),
    FOREIGN KEY (environment, service) REFERENCES services (environment, name) ON DELETE CASCADE
);
