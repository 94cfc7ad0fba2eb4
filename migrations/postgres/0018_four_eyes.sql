-- Four-eyes by the person, and checked when a change runs.
-- The person behind an API token: the user who minted it, or the person behind the token
-- that did (NULL for tokens minted before this column: their `created_by` stands in).
ALTER TABLE tokens ADD COLUMN person TEXT;
-- The person who proposed a change request, through whatever session or token: nobody
-- approves their own request.
ALTER TABLE change_requests ADD COLUMN proposed_person TEXT;
-- Who scheduled a change, so it runs with that user's or token's role at run time (a
-- demoted user, a revoked token: not applied), and the break-glass reason it was scheduled
-- with, if any (the approval rules in force at run time are applied to it).
ALTER TABLE scheduled_changes ADD COLUMN created_user TEXT;
ALTER TABLE scheduled_changes ADD COLUMN created_token TEXT;
ALTER TABLE scheduled_changes ADD COLUMN break_glass TEXT;
