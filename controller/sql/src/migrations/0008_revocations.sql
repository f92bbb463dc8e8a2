-- Revoked certificates, one row per serial: what every replica refuses,
-- whichever host's CA directory the revocation was made in, and what makes
-- each revocation audited once however many replicas pick it up.
CREATE TABLE revocations (
    serial TEXT NOT NULL PRIMARY KEY,
    kind   TEXT NOT NULL,
    name   TEXT NOT NULL,
    at_ns  BIGINT NOT NULL
)
