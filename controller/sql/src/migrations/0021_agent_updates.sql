-- Agent updates (issue 39): each agent's architecture (its hello) and its
-- last word on an update (JSON; NULL: none); the releases operators
-- uploaded (the signed manifest exactly as signed: the boxes check it,
-- the controller relays it; the binary in `release_pieces`, created per
-- engine for its byte type); the update rollouts, each a row of the
-- rollout machine (JSON) with its cohort; and which release each agent is
-- to be offered (`release_targets`, one row per agent at most).
ALTER TABLE agents ADD COLUMN arch TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN agent_update TEXT;

CREATE TABLE releases (
    version     TEXT NOT NULL,
    arch        TEXT NOT NULL,
    manifest    TEXT NOT NULL,
    key_id      TEXT NOT NULL,
    signature   TEXT NOT NULL,
    size        BIGINT NOT NULL,
    sha256      TEXT NOT NULL,
    uploaded_ns BIGINT NOT NULL,
    uploaded_by TEXT NOT NULL,
    PRIMARY KEY (version, arch)
);

CREATE TABLE agent_updates (
    id          BIGINT PRIMARY KEY,
    version     TEXT NOT NULL,
    plan        TEXT NOT NULL,
    targets     TEXT NOT NULL,
    created_by  TEXT NOT NULL,
    machine     TEXT NOT NULL,
    members     TEXT NOT NULL,
    rev         BIGINT NOT NULL,
    is_open     INTEGER NOT NULL
);

CREATE TABLE release_targets (
    agent_id  TEXT PRIMARY KEY,
    version   TEXT NOT NULL,
    update_id BIGINT NOT NULL
);
CREATE INDEX release_targets_by_update ON release_targets (update_id);
