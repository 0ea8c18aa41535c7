//! Records in Redis, shared by every replica that uses the same server.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script};

use super::record::{Found, Stored};
use super::{Fingerprint, Finish, IdempotencyKey, IdempotencyStore, Reservation, StoreError};

/// How long a command, or a connection attempt, may take before the store reports itself
/// unavailable.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Claims a free key (create + expiry, atomically, like `SET NX PX`), or reads the record
/// that holds it, turning a running record whose lease has passed into an uncertain one.
/// Times are the server's clock.
///
/// KEYS: the record. ARGV: execution id, tool, digest, lease (ms), ttl (ms).
const RESERVE: &str = r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'tool', ARGV[2], 'digest', ARGV[3], 'execution_id', ARGV[1],
    'state', 'running', 'reserved_at', now, 'lease_until', now + tonumber(ARGV[4]))
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return {'reserved'}
end
local r = redis.call('HMGET', KEYS[1], 'tool', 'digest', 'execution_id', 'state', 'reserved_at',
  'lease_until', 'status', 'category', 'code', 'body')
if r[4] == 'running' and tonumber(r[6]) < now then
  redis.call('HSET', KEYS[1], 'state', 'uncertain')
  r[4] = 'uncertain'
end
return {'found', r[1], r[2], r[3], r[4], tostring(now - tonumber(r[5])), r[7], r[8], r[9], r[10]}
";

/// Records the outcome, only if the record still belongs to the execution that finishes it.
///
/// KEYS: the record. ARGV: execution id, state, ttl (ms), then for a response: status,
/// category (or ''), code (or ''), body.
const FINISH: &str = r"
if redis.call('HGET', KEYS[1], 'execution_id') ~= ARGV[1]
  or redis.call('HGET', KEYS[1], 'state') == 'finished' then
  return 0
end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
if #ARGV > 3 then
  redis.call('HSET', KEYS[1], 'status', ARGV[4], 'body', ARGV[7])
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'category', ARGV[5]) end
  if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'code', ARGV[6]) end
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
";

/// Idempotency records in Redis, so that replicas sharing the server never run one request
/// twice. Every transition is one Lua script on one hash, so no interleaving of replicas loses
/// a record; keys are hash-tagged (`carmy:idempotency:{…}`) so each lives in one cluster slot.
/// Redis expires records itself.
pub struct RedisStore {
    connection: ConnectionManager,
    reserve: Script,
    finish: Script,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

fn failed(error: RedisError) -> StoreError {
    StoreError(Box::new(error))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// The record's key; the length prefix keeps `caller` and `request_id` apart whatever they
/// contain.
fn record_key(key: &IdempotencyKey) -> String {
    format!(
        "carmy:idempotency:{{{}:{}:{}}}",
        key.caller().len(),
        key.caller(),
        key.request_id()
    )
}

impl RedisStore {
    /// Connects to the server at `url` (`redis://host:port/db`, or `rediss://` for TLS if
    /// redis-rs was built with it). Fails if the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(failed)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT))
            .set_number_of_retries(2);
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(failed)?;
        Ok(RedisStore {
            connection,
            reserve: Script::new(RESERVE),
            finish: Script::new(FINISH),
        })
    }

    async fn reserve_key(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        execution_id: &str,
        lease: Duration,
        ttl: Duration,
    ) -> Result<Reservation, StoreError> {
        let reply: Vec<Option<Vec<u8>>> = self
            .reserve
            .key(record_key(key))
            .arg(execution_id)
            .arg(&*fingerprint.tool)
            .arg(fingerprint.digest.as_slice())
            .arg(millis(lease))
            .arg(millis(ttl))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        let mut fields = reply.into_iter();
        let mut next = || fields.next().flatten();
        let text = |bytes: Option<Vec<u8>>| -> Result<String, StoreError> {
            String::from_utf8(bytes.unwrap_or_default())
                .map_err(|_| StoreError::message("unreadable idempotency record: not UTF-8"))
        };
        if next().as_deref() == Some(b"reserved") {
            return Ok(Reservation::Reserved);
        }
        let tool = text(next())?;
        let digest = next().unwrap_or_default();
        let execution_id = text(next())?;
        let state = text(next())?;
        let running_ms: u64 = text(next())?.parse().unwrap_or(0);
        let (status, category, code, body) = (next(), next(), next(), next());
        let response = match (status, body) {
            (Some(status), Some(body)) => Some(Stored {
                status: text(Some(status))?,
                category: category.map(|name| text(Some(name))).transpose()?,
                code: code.map(|code| text(Some(code))).transpose()?,
                body,
            }),
            _ => None,
        };
        Found {
            tool,
            digest,
            execution_id,
            state,
            running_for: Duration::from_millis(running_ms),
            response,
        }
        .reservation(fingerprint)
    }

    async fn finish_key(
        &self,
        key: &IdempotencyKey,
        finish: &Finish,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let (state, stored) = Stored::of(finish);
        let mut invocation = self.finish.key(record_key(key));
        invocation
            .arg(&**finish.execution_id())
            .arg(state)
            .arg(millis(ttl));
        if let Some(stored) = &stored {
            invocation
                .arg(&stored.status)
                .arg(stored.category.as_deref().unwrap_or(""))
                .arg(stored.code.as_deref().unwrap_or(""))
                .arg(stored.body.as_slice());
        }
        let _: i64 = invocation
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        Ok(())
    }

    async fn release_key(&self, key: &IdempotencyKey) -> Result<(), StoreError> {
        let _: i64 = redis::cmd("DEL")
            .arg(record_key(key))
            .query_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        Ok(())
    }
}

impl IdempotencyStore for RedisStore {
    fn reserve<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        execution_id: &'a Arc<str>,
        lease: Duration,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        Box::pin(self.reserve_key(key, fingerprint, execution_id, lease, ttl))
    }

    fn finish<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        finish: Finish,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { self.finish_key(key, &finish, ttl).await })
    }

    fn release<'a>(&'a self, key: &'a IdempotencyKey) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.release_key(key))
    }

    /// Nothing to do: Redis drops expired keys itself.
    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(std::future::ready(Ok(0)))
    }

    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        Some(Box::pin(async move {
            redis::cmd("PING")
                .query_async::<()>(&mut self.connection.clone())
                .await
                .map_err(failed)
        }))
    }
}
