-- Agent liveness is a lease: the replica holding an agent's stream renews `lease_until`
-- (ms since the epoch) for every stream it holds; an agent counts as connected only while
-- `connected = 1 AND lease_until > now`, so the agents of a replica that was killed stop
-- counting as connected once their lease runs out. `replica` names the holder.
ALTER TABLE agents ADD COLUMN lease_until BIGINT NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN replica TEXT NOT NULL DEFAULT '';
CREATE INDEX agents_by_replica ON agents (replica, connected);
