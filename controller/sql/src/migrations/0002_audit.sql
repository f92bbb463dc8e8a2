-- The audit log: every operator action, refused ones included.
CREATE TABLE audit (
    id BIGINT NOT NULL PRIMARY KEY,
    at_ns BIGINT NOT NULL,
    who TEXT NOT NULL,
    tenant TEXT NOT NULL,
    role TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    result TEXT NOT NULL
);
CREATE INDEX audit_tenant_at ON audit (tenant, at_ns);
CREATE INDEX audit_at ON audit (at_ns);
