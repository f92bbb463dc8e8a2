-- What each agent checks packs against, as it says (its hello, then each
-- change: a list taken or refused, one expired), as JSON (issue 39): the
-- dashboard and `agents` show which boxes require signed packs, which
-- hold an old trust list and which run nothing, and why. NULL: the agent
-- has not said (one older than signed packs).
ALTER TABLE agents ADD COLUMN trust TEXT
