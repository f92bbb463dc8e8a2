-- Followers read events and feedback by (txid, id): the id of the
-- transaction that wrote the row (PostgreSQL: `pg_current_xact_id()`; the
-- embedded store, whose single writer commits in id order: 0), then its
-- id. With replicas writing in parallel, ids are not in commit order;
-- rows of transactions below the oldest one still running are final, so
-- a follower that reads only those (see `events_after`) never skips a row
-- committed late. Existing rows take this migration's transaction.
ALTER TABLE events ADD COLUMN txid {TXID};
CREATE INDEX events_by_mark ON events (txid, id);
ALTER TABLE feedback ADD COLUMN txid {TXID};
CREATE INDEX feedback_by_mark ON feedback (txid, id)
