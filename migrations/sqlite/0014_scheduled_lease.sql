-- A claimed scheduled change holds a lease until `claim_expires_at` (ms since the epoch).
-- A change still 'running' after its lease expired (its replica crashed or lost the
-- database mid-run) is claimed again by any replica, with a conditional UPDATE on the
-- previous claimer, so exactly one takes it over; a run only records its end while it
-- still holds the claim. Rows claimed before this migration have no expiry: reclaimable.
ALTER TABLE scheduled_changes ADD COLUMN claim_expires_at BIGINT;
