-- A replica that reads grouped delivery events (issue 35: one event row
-- naming the agents of a pack whose rows a decision changed, where there
-- was a row per agent) says so in its lease row. A replica writes groups
-- only while every live lease says it reads them: during a rolling
-- upgrade the older replicas, still running on their leases (this
-- column FALSE for them), are told of each row as before, and would
-- otherwise pass a group over as a kind they do not know.
ALTER TABLE replicas ADD COLUMN reads_event_groups BOOLEAN NOT NULL DEFAULT FALSE
