-- SQLite only: the feedback table's (txid, id) index goes. Followers read
-- feedback by mark only where replicas share a store, which takes
-- PostgreSQL; a single controller on SQLite never does, and every feedback
-- row paid for one more index entry for nothing (the fleet bench's
-- ingest, issue 34's A/B: about 7 % more CPU per row than the build
-- before the marks). `txid` itself stays, always 0 here: the shared SQL
-- reads it. A follower on SQLite (the store's contract tests) still gets
-- its rows, by a scan.
DROP INDEX IF EXISTS feedback_by_mark
