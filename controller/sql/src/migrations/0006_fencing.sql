-- Ownership with fencing (replicas on one database).
--
-- `session_gen` counts the agent's streams: every hello raises it (above
-- what the agent says it has seen), and every write a stream makes for
-- its agent (feedback, answers, held, clock, last seen) is refused unless
-- the agent's row still carries that stream's generation. `owner` and
-- `owner_epoch` name the replica (and its lease's epoch) that took the
-- hello: written once per connection, never at heartbeat rate.
ALTER TABLE agents ADD COLUMN session_gen BIGINT NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN owner_epoch BIGINT NOT NULL DEFAULT 0;

-- One row per replica: its lease, renewed every second or two with the
-- database's own clock (microseconds since the epoch). A replica whose
-- lease ran out writes nothing more; a replica (re)starting under the same
-- id takes the next epoch, fencing its earlier self.
CREATE TABLE replicas (
    id         TEXT NOT NULL PRIMARY KEY,
    epoch      BIGINT NOT NULL,
    expires_us BIGINT NOT NULL
)
