-- The dashboard's fleet filtered in SQL (issue 35): a label filter reads
-- the agents carrying the label in id order straight from an index that
-- leads with the label and ends with the agent, so a page costs a page of
-- rows whether the label is rare or on every agent (the index it
-- replaces ended with the label's value: a rare label was cheap, but a
-- common one meant reading and sorting all its agents). The planner's
-- candidate queries (by key and value) use the same indexes.
DROP INDEX agent_own_labels_by_value;
CREATE INDEX agent_own_labels_by_value ON agent_own_labels (key, value, agent_id);
-- A filter by key alone (`line`: any value).
CREATE INDEX agent_own_labels_by_key ON agent_own_labels (key, agent_id);
DROP INDEX agent_labels_by_value;
CREATE INDEX agent_labels_by_value ON agent_labels (tenant, key, value, agent_id)
