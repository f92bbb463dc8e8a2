-- Feedback on PostgreSQL: of the five index entries every row cost, two
-- become block-range summaries (BRIN), a few bytes per 128 pages instead
-- of an entry per row, which the stream's inserts no longer maintain one
-- by one. Both columns grow with the insertion order (a transaction's
-- number; the instant a row was received), which is what BRIN needs.
--
-- * followers read by (txid, id) after a mark: a BRIN on txid finds the
--   few newest block ranges, and the page is sorted;
-- * `received_ns`: a BRIN on each day partition (made with the day) for
--   `--since` and a day's drop check; the DEFAULT partition, whose old
--   rows retention deletes oldest first a batch at a time, keeps a btree
--   (a batch must not sort every old row again).
DROP INDEX feedback_by_received;
DROP INDEX feedback_by_mark;
CREATE INDEX feedback_by_mark ON feedback USING brin (txid);
CREATE INDEX feedback_default_by_received ON feedback_default (received_ns);
DO $$
DECLARE p text;
BEGIN
    FOR p IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'feedback'::regclass AND c.relname <> 'feedback_default'
    LOOP
        EXECUTE format('CREATE INDEX %I ON %I USING brin (received_ns)', p || '_by_received', p);
    END LOOP;
END $$;
