-- One row per (caller, request_id): the idempotency record of protocol.md §4.
CREATE TABLE carmy_idempotency_records (
    caller       text        NOT NULL,
    request_id   text        NOT NULL,
    -- The fingerprint: the tool's name and the digest of the canonical arguments.
    tool         text        NOT NULL,
    digest       bytea       NOT NULL,
    -- The execution that reserved the key (and owns the record while it runs).
    execution_id text        NOT NULL,
    state        text        NOT NULL CHECK (state IN ('running', 'finished', 'uncertain')),
    reserved_at  timestamptz NOT NULL,
    -- Past this, a running record's execution is presumed dead: the record turns uncertain.
    lease_until  timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    -- The stored response of a finished record.
    status       text,
    category     text,
    code         text,
    body         bytea,
    PRIMARY KEY (caller, request_id)
);

CREATE INDEX carmy_idempotency_records_expires_at ON carmy_idempotency_records (expires_at);
