-- Rollouts with `activate: together` (issue 22): when an agent runs the
-- version it is sent (NULL: on arrival, 0: staged, else the instant, ns),
-- and what it said it staged (cleared at its next hello: a restart drops
-- staged copies).
ALTER TABLE deliveries ADD COLUMN activate_ns BIGINT;
ALTER TABLE deliveries ADD COLUMN staged_version BIGINT;
ALTER TABLE deliveries ADD COLUMN staged_at_ns BIGINT
