-- A pack withdrawn from chosen agents (issue 36): a JSON map of agent id
-- to the latest version when it was withdrawn there. No version up to it
-- is planned for that agent again; a newer one is. On the pack row, not
-- the delivery row: a withdrawn agent's row may be deleted (forgotten,
-- its tenant taken back), the stop must stay. NULL: nobody.
ALTER TABLE packs ADD COLUMN stops TEXT;
