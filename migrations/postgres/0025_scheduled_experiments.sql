-- Experiments can be scheduled: a scheduled change of kind 'experiment' starts one when due
-- (experiment_id: the experiment it started, set in the transaction that records it, so a
-- run taken over after its replica died never starts a second one).
ALTER TABLE scheduled_changes DROP CONSTRAINT scheduled_changes_kind_check;
ALTER TABLE scheduled_changes ADD CONSTRAINT scheduled_changes_kind_check
    CHECK (kind IN ('flag', 'policy', 'profile', 'experiment'));
ALTER TABLE scheduled_changes ADD COLUMN experiment_id BIGINT;
