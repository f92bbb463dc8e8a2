-- A release's binary, in pieces of 64 KiB (the most a box asks at once).
CREATE TABLE release_pieces (
    version TEXT NOT NULL,
    arch    TEXT NOT NULL,
    idx     BIGINT NOT NULL,
    data    BLOB NOT NULL,
    PRIMARY KEY (version, arch, idx)
);
