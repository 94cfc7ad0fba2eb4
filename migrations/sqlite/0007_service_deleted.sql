-- A deleted service keeps its row (and so its revision counter and history) with the time
-- it was deleted: a service created again under the same name continues the revision
-- numbers its agents have seen, since an agent never applies a lower revision.
ALTER TABLE services ADD COLUMN deleted_at BIGINT;
