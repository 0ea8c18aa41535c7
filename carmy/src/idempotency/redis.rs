//! Records in Redis, shared by every replica that uses the same server.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisError, Script};
use tokio_util::task::AbortOnDropHandle;

use super::announcements::{AnnouncedIds, Announcements};
use super::record::{Found, Stored, reserve_within, within};
use super::{
    Cancellation, ExecutionQuery, ExecutionRecord, ExecutionState, ExecutionSummary, Fingerprint,
    Finish, IdempotencyKey, IdempotencyStore, KEPT_PROGRESS, RecordedEvent, RecordedOutcome,
    Reservation, StoreError, StoreOptions,
};

/// How many command timeouts redis-rs waits for an answer before it fails the command itself.
/// carmy answers the caller after one; waiting longer lets a claim that lands late be undone.
const GIVE_UP_AFTER: u32 = 6;

/// Claims a free key (create + expiry, atomically, like `SET NX PX`), or reads the record
/// that holds it, turning a running record whose lease has passed into an uncertain one.
/// Times are the server's clock.
///
/// A running record lives until its lease, whatever the ttl, then as an uncertain one for the
/// ttl.
///
/// KEYS: the record. ARGV: execution id, tool, digest, lease (ms), ttl (ms).
const RESERVE: &str = r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'tool', ARGV[2], 'digest', ARGV[3], 'execution_id', ARGV[1],
    'state', 'running', 'reserved_at', now, 'lease_until', now + tonumber(ARGV[4]))
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]) + tonumber(ARGV[5]))
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

/// Deletes the record only if the execution still holds it (fencing).
///
/// KEYS: the record. ARGV: execution id.
const RELEASE: &str = r"
if redis.call('HGET', KEYS[1], 'execution_id') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Keeps a running execution (`protocol.md` §9) until its lease.
///
/// KEYS: the execution. ARGV: caller, tool, lease (ms).
const BEGIN_EXECUTION: &str = r"
redis.call('HSET', KEYS[1], 'caller', ARGV[1], 'tool', ARGV[2], 'cancel', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
";

/// Adds a progress event (`<id> <data>`) to a running execution, keeping the latest ones, and
/// announces it.
///
/// KEYS: the execution, its events. ARGV: event id, data, how many to keep, execution id.
const RECORD_PROGRESS: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], 'status') == 1 then
  return 0
end
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[3]), -1)
redis.call('PEXPIRE', KEYS[2], redis.call('PTTL', KEYS[1]))
redis.call('PUBLISH', 'carmy:executions', ARGV[4])
return 1
";

/// Records how a running execution ended, and announces it; it and its events are kept for
/// the ttl.
///
/// KEYS: the execution, its events. ARGV: status, category (or ''), code (or ''), body,
/// completed event id, ttl (ms), execution id.
const END_EXECUTION: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], 'status') == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'body', ARGV[4], 'final_event_id', ARGV[5])
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'category', ARGV[2]) end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'code', ARGV[3]) end
redis.call('PEXPIRE', KEYS[1], ARGV[6])
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[6]) end
redis.call('PUBLISH', 'carmy:executions', ARGV[7])
return 1
";

/// Reads an execution of a caller and its events, in one step.
///
/// KEYS: the execution, its events. ARGV: caller.
const READ_EXECUTION: &str = r"
local r = redis.call('HMGET', KEYS[1], 'caller', 'tool', 'status', 'category', 'code', 'body',
  'final_event_id', 'cancel')
if r[1] ~= ARGV[1] then return {} end
return {r[2], r[3] or '', r[4] or '', r[5] or '', r[6] or '', r[7] or '', r[8],
  redis.call('LRANGE', KEYS[2], 0, -1)}
";

/// Marks a caller's running execution cancelled and announces it; says what it found.
///
/// KEYS: the execution. ARGV: caller, execution id.
const CANCEL_EXECUTION: &str = r"
if redis.call('HGET', KEYS[1], 'caller') ~= ARGV[1] then return 'not_found' end
if redis.call('HEXISTS', KEYS[1], 'status') == 1 then return 'ended' end
redis.call('HSET', KEYS[1], 'cancel', '1')
redis.call('PUBLISH', 'carmy:executions', ARGV[2])
return 'requested'
";

/// The channel on which the scripts announce changes of executions (`PUBLISH`, message the
/// id).
const ANNOUNCEMENTS: &str = "carmy:executions";

/// Idempotency records in Redis, so that replicas sharing the server never run one request
/// twice. Every transition is one Lua script on one hash, so no interleaving of replicas loses
/// a record; keys are hash-tagged (`carmy:idempotency:{…}`) so each lives in one cluster slot.
/// Redis expires records itself. Every call has the time limits of its [`StoreOptions`].
///
/// Records must survive a restart of Redis, or a retry after one runs again: give the server
/// persistence (`appendonly yes`, or `save` snapshots); a warning is logged at connect when
/// it has neither.
///
/// Changes of executions are announced with `PUBLISH` from the scripts and heard on one
/// pub/sub connection of its own, so other replicas stream and cancel them as they happen.
pub struct RedisStore {
    inner: Arc<Inner>,
    timeout: Duration,
    announcements: Arc<Announcements>,
    _listener: AbortOnDropHandle<()>,
}

/// What a reservation's own task needs (see [`reserve_within`]).
struct Inner {
    connection: ConnectionManager,
    reserve: Script,
    finish: Script,
    release: Script,
    begin_execution: Script,
    record_progress: Script,
    end_execution: Script,
    read_execution: Script,
    cancel_execution: Script,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

fn failed(error: RedisError) -> StoreError {
    StoreError(Box::new(error))
}

/// Opens a managed connection to `url` with carmy's time limits and, for `rediss://`, TLS
/// trusting `options`' root certificates: for the store and the rate limiter alike.
pub(crate) async fn open(
    url: &str,
    options: &StoreOptions,
) -> Result<(ConnectionManager, redis::Client, StoreOptions), StoreError> {
    let (url, options) = options.clone().with_url(url)?;
    let client = client(&url, &options)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.acquire_timeout))
        .set_response_timeout(Some(options.command_timeout * GIVE_UP_AFTER))
        .set_number_of_retries(2);
    let connection = within(options.acquire_timeout + options.command_timeout, async {
        ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(failed)
    })
    .await?;
    Ok((connection, client, options))
}

/// A client for `url`; over TLS (`rediss://`), with rustls trusting `options`' root
/// certificates, or the platform's.
fn client(url: &str, options: &StoreOptions) -> Result<redis::Client, StoreError> {
    let info = url.into_connection_info().map_err(failed)?;
    if !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
        return redis::Client::open(info).map_err(failed);
    }
    super::tls::provider();
    let root_cert =
        (!options.root_certificates.is_empty()).then(|| options.root_certificates.clone());
    redis::Client::build_with_tls(
        info,
        redis::TlsCertificates {
            client_tls: None,
            root_cert,
        },
    )
    .map_err(failed)
}

/// Subscribes to the announcements on a connection of its own: the announced execution ids,
/// until the connection ends.
async fn listen(client: redis::Client) -> Result<AnnouncedIds, StoreError> {
    let mut pubsub = client.get_async_pubsub().await.map_err(failed)?;
    pubsub.subscribe(ANNOUNCEMENTS).await.map_err(failed)?;
    let ids = pubsub
        .into_on_message()
        .filter_map(|message| std::future::ready(message.get_payload::<String>().ok()));
    Ok(ids.boxed())
}

/// Warns when the server keeps nothing across a restart (no append-only file, no snapshots):
/// a restart then forgets every record, and retries run again. Servers that refuse `CONFIG`
/// (managed services) are not second-guessed.
async fn check_persistence(connection: &mut ConnectionManager) {
    let setting = |name: &'static str| {
        let mut connection = connection.clone();
        async move {
            redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async::<std::collections::HashMap<String, String>>(&mut connection)
                .await
                .map(|mut values| values.remove(name).unwrap_or_default())
        }
    };
    match (setting("appendonly").await, setting("save").await) {
        (Ok(appendonly), Ok(save)) if appendonly == "no" && save.trim().is_empty() => {
            tracing::warn!(
                "the Redis idempotency store has no persistence (appendonly no, save \"\"): a \
                 restart of Redis forgets every record, and retries of calls made before it run \
                 again; enable appendonly (or save snapshots) on the server"
            );
        }
        (Ok(_), Ok(_)) => {}
        (Err(error), _) | (_, Err(error)) => {
            tracing::debug!(%error, "could not read the Redis persistence settings");
        }
    }
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

/// An execution's hash; its events' list shares the hash tag (one cluster slot).
fn execution_key(execution_id: &str) -> String {
    format!("carmy:execution:{{{execution_id}}}")
}

fn events_key(execution_id: &str) -> String {
    format!("carmy:execution:{{{execution_id}}}:events")
}

/// A caller's executions, by id (a UUID v7: lexical order is time order).
fn caller_key(caller: &str) -> String {
    format!("carmy:executions:{{{}:{caller}}}", caller.len())
}

fn unreadable(what: &str) -> StoreError {
    StoreError::message(format!("unreadable execution: {what}"))
}

fn text(bytes: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(bytes).map_err(|_| unreadable("not UTF-8"))
}

impl RedisStore {
    /// Connects to the server at `url` (`redis://host:port/db`, or `rediss://` for TLS).
    /// Fails if the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, StoreOptions::new()).await
    }

    /// Like [`RedisStore::connect`], with the time limits and certificates of `options`.
    pub async fn connect_with(url: &str, options: StoreOptions) -> Result<Self, StoreError> {
        let (mut connection, client, options) = open(url, &options).await?;
        within(options.command_timeout * 2, async {
            check_persistence(&mut connection).await;
            Ok(())
        })
        .await
        .unwrap_or_else(
            |error| tracing::debug!(%error, "could not read the Redis persistence settings"),
        );
        let announcements = Announcements::new(options.execution_recheck);
        let listen = move || -> BoxFuture<'static, Result<AnnouncedIds, StoreError>> {
            let client = client.clone();
            Box::pin(within(
                options.acquire_timeout + options.command_timeout,
                listen(client),
            ))
        };
        let listener = announcements.listen(listen().await?, listen);
        Ok(RedisStore {
            announcements,
            _listener: listener,
            inner: Arc::new(Inner {
                connection,
                reserve: Script::new(RESERVE),
                finish: Script::new(FINISH),
                release: Script::new(RELEASE),
                begin_execution: Script::new(BEGIN_EXECUTION),
                record_progress: Script::new(RECORD_PROGRESS),
                end_execution: Script::new(END_EXECUTION),
                read_execution: Script::new(READ_EXECUTION),
                cancel_execution: Script::new(CANCEL_EXECUTION),
            }),
            timeout: options.command_timeout,
        })
    }
}

impl Inner {
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

    async fn release_key(
        &self,
        key: &IdempotencyKey,
        execution_id: &str,
    ) -> Result<(), StoreError> {
        let _: i64 = self
            .release
            .key(record_key(key))
            .arg(execution_id)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        Ok(())
    }
}

impl Inner {
    async fn read_execution(
        &self,
        caller: &str,
        execution_id: &str,
    ) -> Result<Option<ExecutionRecord>, StoreError> {
        let reply: Vec<redis::Value> = self
            .read_execution
            .key(execution_key(execution_id))
            .key(events_key(execution_id))
            .arg(caller)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        if reply.is_empty() {
            return Ok(None);
        }
        let mut fields = reply.into_iter();
        let mut next_bytes = || -> Result<Vec<u8>, StoreError> {
            match fields.next() {
                Some(value) => {
                    redis::from_redis_value(value).map_err(|error| StoreError(Box::new(error)))
                }
                None => Err(unreadable("missing field")),
            }
        };
        let tool = text(next_bytes()?)?;
        let status = text(next_bytes()?)?;
        let category = text(next_bytes()?)?;
        let code = text(next_bytes()?)?;
        let body = next_bytes()?;
        let final_event_id = text(next_bytes()?)?;
        let cancel = text(next_bytes()?)?;
        let events: Vec<Vec<u8>> = match fields.next() {
            Some(value) => {
                redis::from_redis_value(value).map_err(|error| StoreError(Box::new(error)))?
            }
            None => Vec::new(),
        };
        let progress = events
            .into_iter()
            .map(|entry| {
                let space = entry
                    .iter()
                    .position(|byte| *byte == b' ')
                    .ok_or_else(|| unreadable("event"))?;
                let id = std::str::from_utf8(&entry[..space])
                    .ok()
                    .and_then(|id| id.parse().ok())
                    .ok_or_else(|| unreadable("event id"))?;
                Ok(RecordedEvent {
                    id,
                    data: entry[space + 1..].to_vec().into(),
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let outcome = if status.is_empty() {
            None
        } else {
            let stored = Stored {
                status,
                category: (!category.is_empty()).then_some(category),
                code: (!code.is_empty()).then_some(code),
                body,
            };
            Some(RecordedOutcome {
                response: stored.response(execution_id)?,
                event_id: final_event_id
                    .parse()
                    .map_err(|_| unreadable("final event id"))?,
            })
        };
        Ok(Some(ExecutionRecord {
            execution_id: Arc::from(execution_id),
            tool: Arc::from(tool),
            progress,
            outcome,
            cancel_requested: cancel == "1",
        }))
    }

    async fn list_executions(
        &self,
        caller: &str,
        query: &ExecutionQuery,
    ) -> Result<Vec<ExecutionSummary>, StoreError> {
        let index = caller_key(caller);
        let mut connection = self.connection.clone();
        let mut found = Vec::new();
        let mut upper = match &query.before {
            Some(before) => format!("({before}"),
            None => "+".to_owned(),
        };
        // Pages of the index until enough executions match (expired ones leave the index here).
        while found.len() < query.limit {
            let ids: Vec<String> = redis::cmd("ZREVRANGEBYLEX")
                .arg(&index)
                .arg(&upper)
                .arg("-")
                .arg("LIMIT")
                .arg(0)
                .arg(query.limit)
                .query_async(&mut connection)
                .await
                .map_err(failed)?;
            let Some(last) = ids.last() else { break };
            upper = format!("({last}");
            for id in &ids {
                let mut read = redis::cmd("HMGET");
                read.arg(execution_key(id)).arg("tool").arg("status");
                let (tool, status): (Option<String>, Option<String>) =
                    read.query_async(&mut connection).await.map_err(failed)?;
                let Some(tool) = tool else {
                    let _: i64 = redis::cmd("ZREM")
                        .arg(&index)
                        .arg(id)
                        .query_async(&mut connection)
                        .await
                        .map_err(failed)?;
                    continue;
                };
                let state = match status {
                    None => ExecutionState::Running,
                    Some(status) => {
                        ExecutionState::from_wire(&status).ok_or_else(|| unreadable("status"))?
                    }
                };
                let wanted = query.state.is_none_or(|wanted| wanted == state)
                    && query.tool.as_deref().is_none_or(|wanted| wanted == tool);
                if wanted && found.len() < query.limit {
                    found.push(ExecutionSummary {
                        execution_id: Arc::from(id.as_str()),
                        tool: Arc::from(tool),
                        state,
                    });
                }
            }
        }
        Ok(found)
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
        let reserve = {
            let (inner, key, fingerprint, execution_id) = (
                Arc::clone(&self.inner),
                key.clone(),
                fingerprint.clone(),
                Arc::clone(execution_id),
            );
            async move {
                inner
                    .reserve_key(&key, &fingerprint, &execution_id, lease, ttl)
                    .await
            }
        };
        let (inner, key, execution_id, timeout) = (
            Arc::clone(&self.inner),
            key.clone(),
            Arc::clone(execution_id),
            self.timeout,
        );
        let undo = move || {
            let (inner, key, execution_id) =
                (Arc::clone(&inner), key.clone(), Arc::clone(&execution_id));
            async move { within(timeout, inner.release_key(&key, &execution_id)).await }
        };
        Box::pin(reserve_within(self.timeout, lease, reserve, undo))
    }

    fn finish<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        finish: Finish,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(
            async move { within(self.timeout, self.inner.finish_key(key, &finish, ttl)).await },
        )
    }

    fn release<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.release_key(key, execution_id),
        ))
    }

    /// Nothing to do: Redis drops expired keys itself.
    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(std::future::ready(Ok(0)))
    }

    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        Some(Box::pin(within(self.timeout, async move {
            redis::cmd("PING")
                .query_async::<()>(&mut self.inner.connection.clone())
                .await
                .map_err(failed)
        })))
    }

    fn keeps_executions(&self) -> bool {
        true
    }

    fn begin_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a Arc<str>,
        tool: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(self.timeout, async move {
            let mut connection = self.inner.connection.clone();
            let _: i64 = self
                .inner
                .begin_execution
                .key(execution_key(execution_id))
                .arg(caller)
                .arg(tool)
                .arg(millis(lease))
                .invoke_async(&mut connection)
                .await
                .map_err(failed)?;
            // The caller's index lives in the caller's slot: a second command. Its entries
            // outlive their executions and are dropped when a listing finds them gone.
            let index = caller_key(caller);
            let _: () = redis::pipe()
                .cmd("ZADD")
                .arg(&index)
                .arg(0)
                .arg(&**execution_id)
                .ignore()
                .cmd("PERSIST")
                .arg(&index)
                .ignore()
                .query_async(&mut connection)
                .await
                .map_err(failed)?;
            Ok(())
        }))
    }

    fn record_progress<'a>(
        &'a self,
        execution_id: &'a str,
        event: RecordedEvent,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(self.timeout, async move {
            let _: i64 = self
                .inner
                .record_progress
                .key(execution_key(execution_id))
                .key(events_key(execution_id))
                .arg(event.id)
                .arg(event.data.as_ref())
                .arg(KEPT_PROGRESS)
                .arg(execution_id)
                .invoke_async(&mut self.inner.connection.clone())
                .await
                .map_err(failed)?;
            Ok(())
        }))
    }

    fn end_execution<'a>(
        &'a self,
        execution_id: &'a str,
        outcome: RecordedOutcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(self.timeout, async move {
            let (_, stored) = Stored::of(&Finish::Response(outcome.response));
            let stored = stored.ok_or_else(|| unreadable("an ended execution has a response"))?;
            let _: i64 = self
                .inner
                .end_execution
                .key(execution_key(execution_id))
                .key(events_key(execution_id))
                .arg(&stored.status)
                .arg(stored.category.as_deref().unwrap_or(""))
                .arg(stored.code.as_deref().unwrap_or(""))
                .arg(stored.body.as_slice())
                .arg(outcome.event_id)
                .arg(millis(ttl))
                .arg(execution_id)
                .invoke_async(&mut self.inner.connection.clone())
                .await
                .map_err(failed)?;
            Ok(())
        }))
    }

    fn execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ExecutionRecord>, StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.read_execution(caller, execution_id),
        ))
    }

    fn executions<'a>(
        &'a self,
        caller: &'a str,
        query: &'a ExecutionQuery,
    ) -> BoxFuture<'a, Result<Vec<ExecutionSummary>, StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.list_executions(caller, query),
        ))
    }

    fn cancel_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Cancellation, StoreError>> {
        Box::pin(within(self.timeout, async move {
            let found: String = self
                .inner
                .cancel_execution
                .key(execution_key(execution_id))
                .arg(caller)
                .arg(execution_id)
                .invoke_async(&mut self.inner.connection.clone())
                .await
                .map_err(failed)?;
            Ok(match found.as_str() {
                "requested" => Cancellation::Requested,
                "ended" => Cancellation::Ended,
                _ => Cancellation::NotFound,
            })
        }))
    }

    fn execution_changed(&self, execution_id: &str) -> BoxFuture<'static, ()> {
        self.announcements.changed(execution_id)
    }
}
