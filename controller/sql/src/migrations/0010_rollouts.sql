-- Rollouts (issue 22): a pack version given to the fleet stage by stage.
-- `packs.gate` is the planner's input while a rollout governs the latest
-- version (JSON: rollout, from, members_hold); NULL: every target gets it.
ALTER TABLE packs ADD COLUMN gate TEXT;
ALTER TABLE pack_versions ADD COLUMN rollout BIGINT NOT NULL DEFAULT 0;
-- One row per rolled-out version; `rev` is its compare-and-set counter,
-- `doc` the rest (stage, timestamps, verdicts with their inputs) as JSON.
CREATE TABLE rollouts (
    tenant TEXT NOT NULL,
    pack TEXT NOT NULL,
    version BIGINT NOT NULL,
    rev BIGINT NOT NULL,
    state TEXT NOT NULL,
    doc TEXT NOT NULL,
    created_ns BIGINT NOT NULL,
    updated_ns BIGINT NOT NULL,
    PRIMARY KEY (tenant, pack, version)
);
CREATE INDEX rollouts_state ON rollouts (state);
-- The cohort: agents let onto the version, and by which stage.
CREATE TABLE rollout_members (
    tenant TEXT NOT NULL,
    pack TEXT NOT NULL,
    version BIGINT NOT NULL,
    agent_id TEXT NOT NULL,
    stage BIGINT NOT NULL,
    skipped BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, pack, version, agent_id)
)
