-- What one replica's sessions and watchers must hear of that happened on
-- another: which delivery row changed, which agent connected, left or
-- reported its clock. Rows point at the state (readers read the row or
-- the agent as it is now); they are a transport, kept minutes.
--
-- Ids are handed out in commit order: every write batch holds the store's
-- write lock until it commits, so no row with a smaller id can commit
-- after one with a larger id, and a reader paging by id never skips a row
-- committed late.
CREATE TABLE events (
    id       {ID},
    replica  TEXT NOT NULL,
    kind     TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    tenant   TEXT NOT NULL,
    pack     TEXT NOT NULL,
    detail   TEXT NOT NULL,
    at_ns    BIGINT NOT NULL
);
CREATE INDEX events_at ON events (at_ns)
