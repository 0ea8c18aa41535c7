-- The PostgreSQL store's own statements for one call with a fresh request_id, as carmy sends
-- them (carmy/src/idempotency/postgres.rs: CLAIM, then FINISH, each autocommitted, prepared):
-- what `pgbench -M prepared -f` measures is the engine's limit for carmy's way of keeping
-- records. `benches/engines.py` runs it beside the example on the same store.
\set n random(1, 2000000000)
WITH inserted AS (
    INSERT INTO carmy_idempotency_records
        (caller, request_id, tool, digest, execution_id, state, reserved_at, lease_until,
         expires_at)
    VALUES ('peer:127.0.0.1', 'pgbench-' || :client_id || '-' || :n, 'create_order',
            '\x8f2b1c7e0a9d4e6b3f5a2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f'::bytea,
            'exec_01a23190-0000-7000-8000-000000000000', 'running', now(),
            now() + 30500::bigint * interval '1 millisecond',
            now() + (30500::bigint + 86400000::bigint) * interval '1 millisecond')
    ON CONFLICT (caller, request_id) DO NOTHING
    RETURNING 1
), taken_over AS (
    UPDATE carmy_idempotency_records
    SET tool = 'create_order',
        digest = '\x8f2b1c7e0a9d4e6b3f5a2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f'::bytea,
        execution_id = 'exec_01a23190-0000-7000-8000-000000000000', state = 'running',
        reserved_at = now(), lease_until = now() + 30500::bigint * interval '1 millisecond',
        expires_at = now() + (30500::bigint + 86400000::bigint) * interval '1 millisecond',
        status = NULL, category = NULL, code = NULL, body = NULL
    WHERE caller = 'peer:127.0.0.1' AND request_id = 'pgbench-' || :client_id || '-' || :n
      AND expires_at <= now() AND NOT EXISTS (SELECT 1 FROM inserted)
    RETURNING 1
)
SELECT 1 FROM inserted UNION ALL SELECT 1 FROM taken_over;
UPDATE carmy_idempotency_records
SET state = 'finished', status = 'completed', category = NULL, code = NULL,
    body = '\x7b22657865637574696f6e5f6964223a2265786563227d'::bytea,
    expires_at = now() + 86400000::bigint * interval '1 millisecond'
WHERE caller = 'peer:127.0.0.1' AND request_id = 'pgbench-' || :client_id || '-' || :n
  AND execution_id = 'exec_01a23190-0000-7000-8000-000000000000' AND state <> 'finished';
