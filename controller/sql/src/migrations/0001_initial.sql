-- baton controller store, schema v1.
--
-- Plain SQL that runs on SQLite and on PostgreSQL alike: BIGINT, TEXT,
-- DOUBLE PRECISION and INTEGER columns only, no AUTOINCREMENT, no
-- engine-specific functions. Unsigned values (versions, sequence numbers,
-- attempts, line numbers) are BIGINT: PostgreSQL's INTEGER is 32-bit
-- signed and would not hold a u32. Labels, held packs, targets and
-- validation errors are JSON text: they are read and written whole, never
-- queried inside.

-- Agents as the controller knows them; the clock_* columns are the latest
-- clock report (all NULL until the first one).
CREATE TABLE agents (
    id                   TEXT NOT NULL PRIMARY KEY,
    labels               TEXT NOT NULL,
    agent_version        TEXT NOT NULL,
    journal_id           TEXT NOT NULL,
    connected            INTEGER NOT NULL,
    last_seen_ns         BIGINT NOT NULL,
    held                 TEXT NOT NULL,
    clock_source         TEXT,
    clock_state          TEXT,
    clock_offset_ns      BIGINT,
    clock_jitter_ns      BIGINT,
    clock_uncertainty_ns BIGINT,
    clock_frequency_ppm  DOUBLE PRECISION,
    clock_at_ns          BIGINT
);

-- Every clock report, keyed by the instant the agent measured it, so a
-- re-sent report is stored once.
CREATE TABLE clock_reports (
    agent_id       TEXT NOT NULL REFERENCES agents (id),
    at_ns          BIGINT NOT NULL,
    source         TEXT NOT NULL,
    state          TEXT NOT NULL,
    offset_ns      BIGINT NOT NULL,
    jitter_ns      BIGINT NOT NULL,
    uncertainty_ns BIGINT NOT NULL,
    frequency_ppm  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (agent_id, at_ns)
);

-- One row per pack: which version is the latest, and whether it was
-- withdrawn.
CREATE TABLE packs (
    tenant         TEXT NOT NULL,
    pack           TEXT NOT NULL,
    latest_version BIGINT NOT NULL,
    cancelled_ns   BIGINT,
    PRIMARY KEY (tenant, pack)
);

-- Every version ever pushed, as pushed.
CREATE TABLE pack_versions (
    tenant    TEXT NOT NULL,
    pack      TEXT NOT NULL,
    version   BIGINT NOT NULL,
    yaml      TEXT NOT NULL,
    targets   TEXT NOT NULL,
    pushed_ns BIGINT NOT NULL,
    PRIMARY KEY (tenant, pack, version),
    FOREIGN KEY (tenant, pack) REFERENCES packs (tenant, pack)
);

-- Desired state and how far it got, per agent and pack version. No
-- foreign key to agents: a pack may name an agent that never connected.
CREATE TABLE deliveries (
    agent_id   TEXT NOT NULL,
    tenant     TEXT NOT NULL,
    pack       TEXT NOT NULL,
    version    BIGINT NOT NULL,
    state      TEXT NOT NULL CHECK (state IN ('pending', 'acked', 'nacked', 'cancelled')),
    reason     TEXT NOT NULL,
    errors     TEXT NOT NULL,
    updated_ns BIGINT NOT NULL,
    attempts   BIGINT NOT NULL,
    PRIMARY KEY (agent_id, tenant, pack, version),
    FOREIGN KEY (tenant, pack, version) REFERENCES pack_versions (tenant, pack, version)
);
CREATE INDEX deliveries_by_pack ON deliveries (tenant, pack, version);

-- Feedback, stored once per (agent, journal, seq): the key the agent
-- chose, so a re-send after a lost ack is recognised. `id` is the storage
-- order, assigned by the single writer. No foreign keys: feedback is
-- stored before it is acknowledged and is never refused for what it
-- refers to.
CREATE TABLE feedback (
    id             BIGINT NOT NULL UNIQUE,
    agent_id       TEXT NOT NULL,
    journal_id     TEXT NOT NULL,
    seq            BIGINT NOT NULL,
    execution_id   TEXT NOT NULL,
    tenant         TEXT NOT NULL,
    pack           TEXT NOT NULL,
    version        BIGINT NOT NULL,
    instruction    TEXT NOT NULL,
    attempt        BIGINT NOT NULL,
    scheduled_ns   BIGINT NOT NULL,
    actual_ns      BIGINT NOT NULL,
    lateness_ns    BIGINT NOT NULL,
    outcome        TEXT NOT NULL,
    event          TEXT NOT NULL,
    action         TEXT NOT NULL,
    detail         TEXT NOT NULL,
    value          BIGINT,
    dropped_before BIGINT NOT NULL,
    uncertainty_ns BIGINT NOT NULL,
    received_ns    BIGINT NOT NULL,
    PRIMARY KEY (agent_id, journal_id, seq)
);
CREATE INDEX feedback_by_pack ON feedback (tenant, pack, id);
CREATE INDEX feedback_by_received ON feedback (received_ns);
