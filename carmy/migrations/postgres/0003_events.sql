-- Event subscriptions made through the API (protocol.md §8); those of the configuration file
-- are not kept here.
CREATE TABLE carmy_event_subscriptions (
    id                    text        PRIMARY KEY,
    url                   text        NOT NULL,
    event_types           text[]      NOT NULL,
    description           text,
    -- The signing key, and the one it replaced on rotation with the time it stops signing.
    secret                bytea       NOT NULL,
    previous_secret       bytea,
    previous_secret_until timestamptz,
    created_at            timestamptz NOT NULL,
    -- NULL while it is enabled.
    disabled_reason       text,
    failing_since         timestamptz
);

CREATE INDEX carmy_event_subscriptions_created_at ON carmy_event_subscriptions (created_at, id);

-- The outbox: one row per event and subscription until it is delivered or has failed for good.
-- A claimed row is due again when its claim's lease passes (its replica died).
CREATE TABLE carmy_event_deliveries (
    event_id        text        NOT NULL,
    -- Not a reference: subscriptions of the configuration file are not in the table.
    subscription_id text        NOT NULL,
    event_type      text        NOT NULL,
    body            bytea       NOT NULL,
    -- Attempts made so far.
    attempts        integer     NOT NULL DEFAULT 0,
    due             timestamptz NOT NULL,
    -- The current claim's token; NULL until claimed, and again once rescheduled.
    claim           text,
    PRIMARY KEY (event_id, subscription_id)
);

CREATE INDEX carmy_event_deliveries_due ON carmy_event_deliveries (due);
CREATE INDEX carmy_event_deliveries_by_subscription ON carmy_event_deliveries (subscription_id);

-- The latest attempts per subscription, in the order they were logged (id).
CREATE TABLE carmy_event_attempts (
    id              bigserial   PRIMARY KEY,
    subscription_id text        NOT NULL,
    event_id        text        NOT NULL,
    at              timestamptz NOT NULL,
    status          integer,
    duration_ms     bigint      NOT NULL,
    error           text
);

CREATE INDEX carmy_event_attempts_by_subscription ON carmy_event_attempts (subscription_id, id);
