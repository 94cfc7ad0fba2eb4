-- Why an audited attempt ended as it did, in words for people: the error of a refused or
-- conflicting change, what a profile revert restored or left, what a scheduled run did.
-- `before` and `after` hold only JSON values of the target (as it was, as it is after);
-- rows written before this migration have no detail.
ALTER TABLE audit ADD COLUMN detail TEXT;
