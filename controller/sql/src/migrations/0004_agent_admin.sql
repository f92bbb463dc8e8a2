-- Operator labels on agents (admins, `agents label`): per tenant, they
-- apply to that tenant's packs only, over the agent's own hello labels.
-- `value` NULL hides the agent's own key. Kept across hellos; gone when
-- the agent is forgotten.
CREATE TABLE agent_labels (
    agent_id TEXT NOT NULL REFERENCES agents (id),
    tenant   TEXT NOT NULL,
    key      TEXT NOT NULL,
    value    TEXT,
    PRIMARY KEY (agent_id, tenant, key)
);
