-- Executions kept for their callers (protocol.md §9), one row each; readable on every replica.
CREATE TABLE carmy_executions (
    execution_id     text        PRIMARY KEY,
    caller           text        NOT NULL,
    tool             text        NOT NULL,
    -- NULL while it runs; then the stored response, as in carmy_idempotency_records.
    status           text,
    category         text,
    code             text,
    body             bytea,
    -- The id of its execution.completed event.
    final_event_id   bigint,
    cancel_requested boolean     NOT NULL DEFAULT false,
    -- A running execution's lease, then the record ttl once it ended.
    expires_at       timestamptz NOT NULL
);

CREATE INDEX carmy_executions_by_caller ON carmy_executions (caller, execution_id);
CREATE INDEX carmy_executions_expires_at ON carmy_executions (expires_at);

-- The latest progress events of each execution, with the ids they were streamed with.
CREATE TABLE carmy_execution_events (
    execution_id text   NOT NULL REFERENCES carmy_executions ON DELETE CASCADE,
    id           bigint NOT NULL,
    data         bytea  NOT NULL,
    PRIMARY KEY (execution_id, id)
);
