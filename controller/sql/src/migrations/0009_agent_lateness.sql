-- An agent's start lateness p99, as the stream serving it last measured
-- it (written with last-seen, every few seconds): what `agents` shows on
-- the replicas that do not serve it.
ALTER TABLE agents ADD COLUMN lateness_p99_ns BIGINT NOT NULL DEFAULT 0
