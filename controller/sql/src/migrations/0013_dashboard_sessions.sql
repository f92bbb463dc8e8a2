-- Dashboard sessions and failed log-ins in the store, so that every
-- replica behind one address shares them (issue 35): a session made on
-- one replica is valid on the others, a log-out or a revocation ends it
-- on all of them, and failed log-ins spread over replicas add up.
--
-- `id_hash` is the SHA-256 of the cookie's value (hex): the value itself
-- is never stored, so whoever reads the database cannot replay a cookie.
-- `who` is the operator's `baton:` URI. A session stands while
-- `expires_ns` is ahead and its `serial` is not in `revocations`.
CREATE TABLE dashboard_sessions (
    id_hash    TEXT NOT NULL PRIMARY KEY,
    who        TEXT NOT NULL,
    serial     TEXT NOT NULL,
    csrf       TEXT NOT NULL,
    created_ns BIGINT NOT NULL,
    expires_ns BIGINT NOT NULL
);
-- A certificate's sessions, oldest first (its cap); ended ones, soonest
-- first (deleted as new ones are made).
CREATE INDEX dashboard_sessions_by_serial ON dashboard_sessions (serial, created_ns);
CREATE INDEX dashboard_sessions_by_expiry ON dashboard_sessions (expires_ns);

-- Failed log-ins, counted per source (an address) and fixed window (its
-- start); windows older than the throttle reads are deleted as new
-- failures are counted.
CREATE TABLE login_failures (
    source    TEXT NOT NULL,
    window_ns BIGINT NOT NULL,
    failures  BIGINT NOT NULL,
    PRIMARY KEY (source, window_ns)
);
CREATE INDEX login_failures_by_window ON login_failures (window_ns)
