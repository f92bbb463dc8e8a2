-- A pack withdrawn from chosen agents (issue 36): a JSON map of agent id
-- to the latest version when it was withdrawn there. No version up to it
-- is planned for that agent again; a newer one is. On the pack row, not
-- the delivery row: a withdrawn agent's row may be deleted (forgotten,
-- its tenant taken back), the stop must stay. NULL: nobody.
ALTER TABLE packs ADD COLUMN stops TEXT;
-- What the stream serving an agent measured of its health beside the
-- clock, written with its last-seen mark so that every replica's
-- "unhealthy" filter sees it: its outbox backlog at the last report,
-- whether that backlog rose report after report, and whether a firing was
-- skipped as later than its bound within the last minute.
ALTER TABLE agents ADD COLUMN outbox_entries BIGINT NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN outbox_growing INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN late_recently INTEGER NOT NULL DEFAULT 0;
