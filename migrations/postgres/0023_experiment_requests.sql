-- Experiments are changes that approval rules can cover: a change request can propose one
-- (kind 'experiment'), and applying it starts it (experiment_id: the experiment started).
ALTER TABLE change_requests DROP CONSTRAINT change_requests_kind_check;
ALTER TABLE change_requests ADD CONSTRAINT change_requests_kind_check
    CHECK (kind IN ('flag', 'policy', 'profile', 'experiment'));
ALTER TABLE change_requests ADD COLUMN experiment_id BIGINT;
