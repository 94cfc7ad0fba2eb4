-- Flags tokens (OFREP evaluation, read-only, scoped like an agent token): a third kind.
ALTER TABLE tokens DROP CONSTRAINT tokens_kind_check;
ALTER TABLE tokens ADD CONSTRAINT tokens_kind_check CHECK (kind IN ('api', 'agent', 'flags'));
