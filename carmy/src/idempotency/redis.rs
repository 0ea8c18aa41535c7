//! Records in Redis, shared by every replica that uses the same server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisError, Script};
use tokio_util::task::AbortOnDropHandle;

use super::announcements::{AnnouncedIds, Announcements};
use super::record::{Found, Stored, reserve_within, within};
use super::{
    AfterAttempt, Cancellation, ClaimedDelivery, DeliveryAttempt, ExecutionQuery, ExecutionRecord,
    ExecutionState, ExecutionSummary, Fingerprint, Finish, IdempotencyKey, IdempotencyStore,
    KEPT_ATTEMPTS, KEPT_PROGRESS, OutboxEvent, RecordedEvent, RecordedOutcome, Reservation,
    StoreError, StoreOptions, StoredSubscription,
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

/// Saves a subscription whole (the fields it does not have are dropped) and indexes it by
/// creation time.
///
/// KEYS: the subscription, the index of subscriptions. ARGV: id, created at (ms), then the
/// fields, name and value.
const SAVE_SUBSCRIPTION: &str = r"
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
";

/// Every subscription, oldest first (by creation time, then id: the index's order): id and
/// fields (name, value, …) of each.
///
/// KEYS: the index of subscriptions. ARGV: the subscriptions' key prefix.
const SUBSCRIPTIONS: &str = r"
local found = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local fields = redis.call('HGETALL', ARGV[1] .. id)
  if #fields > 0 then
    found[#found + 1] = id
    found[#found + 1] = fields
  end
end
return found
";

/// Deletes a subscription with its deliveries and its attempts; 1 if the subscription was
/// there.
///
/// KEYS: the subscription, the index of subscriptions, its deliveries (a set of delivery
/// ids), its attempts, the deliveries by due time. ARGV: id, the deliveries' key prefix.
const DELETE_SUBSCRIPTION: &str = r"
for _, delivery in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  redis.call('DEL', ARGV[2] .. delivery)
  redis.call('ZREM', KEYS[5], delivery)
end
redis.call('DEL', KEYS[3], KEYS[4])
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('DEL', KEYS[1])
";

/// Writes an event's deliveries, due now (the server's clock); one already written stays as
/// it is.
///
/// KEYS: the deliveries by due time. ARGV: the deliveries' key prefix, the key prefix of the
/// subscriptions' delivery sets, event id, event type, body, then per subscription its id and
/// the delivery's id.
const ENQUEUE_EVENT: &str = r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
for i = 6, #ARGV, 2 do
  local subscription, delivery = ARGV[i], ARGV[i + 1]
  local key = ARGV[1] .. delivery
  if redis.call('EXISTS', key) == 0 then
    redis.call('HSET', key, 'subscription_id', subscription, 'event_id', ARGV[3],
      'event_type', ARGV[4], 'body', ARGV[5], 'attempts', 0)
    redis.call('ZADD', KEYS[1], now, delivery)
    redis.call('SADD', ARGV[2] .. subscription, delivery)
  end
end
return 1
";

/// Claims up to a number of due deliveries, earliest due first: each gets a claim token and is
/// due again when the lease passes (should its replica die before it finishes the attempt).
/// One script, so replicas claiming together never get the same delivery. Returns, per claim:
/// subscription id, event id, event type, body, attempts made, the token.
///
/// KEYS: the deliveries by due time. ARGV: how many at most, the lease (ms), the deliveries'
/// key prefix, then the claim tokens to hand out (at least as many).
const CLAIM_DELIVERIES: &str = r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local claimed = {}
for _, delivery in ipairs(due) do
  local key = ARGV[3] .. delivery
  local d = redis.call('HMGET', key, 'subscription_id', 'event_id', 'event_type', 'body',
    'attempts')
  if d[1] then
    local token = ARGV[4 + #claimed]
    redis.call('HSET', key, 'claim', token)
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), delivery)
    claimed[#claimed + 1] = {d[1], d[2], d[3], d[4], d[5], token}
  else
    redis.call('ZREM', KEYS[1], delivery)
  end
end
return claimed
";

/// Logs an attempt (keeping the latest ones), then, if the claim still holds the delivery,
/// removes it ('remove': delivered, or failed for good) or counts the attempt and makes it due
/// again after a delay, unclaimed ('retry'). Returns 1 if the claim held.
///
/// KEYS: the delivery, the deliveries by due time, the subscription's deliveries, the
/// subscription's attempts. ARGV: the delivery's id, the claim token, the attempt, how many
/// attempts to keep, 'remove' or 'retry', the delay (ms).
const FINISH_ATTEMPT: &str = r"
redis.call('LPUSH', KEYS[4], ARGV[3])
redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[4]) - 1)
if redis.call('HGET', KEYS[1], 'claim') ~= ARGV[2] then return 0 end
if ARGV[5] == 'remove' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('SREM', KEYS[3], ARGV[1])
else
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  redis.call('HINCRBY', KEYS[1], 'attempts', 1)
  redis.call('HDEL', KEYS[1], 'claim')
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[6]), ARGV[1])
end
return 1
";

/// The channel on which the scripts announce changes of executions (`PUBLISH`, message the
/// id).
const ANNOUNCEMENTS: &str = "carmy:executions";

/// The outbox's keys (`protocol.md` §8) share one hash tag, so every outbox script touches one
/// cluster slot.
const OUTBOX: &str = "carmy:outbox:{events}:";

/// Deliveries claimed per call at most (each gets a claim token made here).
const CLAIM_BATCH: usize = 1_000;

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
///
/// It keeps events too (`protocol.md` §8), under one hash tag (`carmy:outbox:{events}:…`, one
/// cluster slot): subscriptions in hashes indexed by creation time, the outbox as delivery
/// hashes and a sorted set by due time (claimed by one script, so replicas never share a
/// claim; due again when a dead replica's lease passes), and each subscription's attempt log
/// in a list.
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
    save_subscription: Script,
    subscriptions: Script,
    delete_subscription: Script,
    enqueue_event: Script,
    claim_deliveries: Script,
    finish_attempt: Script,
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
    crate::tls::provider();
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

/// The deliveries by due time (ms): a sorted set of delivery ids.
fn due_key() -> String {
    format!("{OUTBOX}due")
}

/// The subscriptions by creation time (ms), then id: a sorted set of ids.
fn subscriptions_key() -> String {
    format!("{OUTBOX}subscriptions")
}

/// A subscription's hash.
fn subscription_key(id: &str) -> String {
    format!("{OUTBOX}subscription:{id}")
}

/// A subscription's deliveries: a set of delivery ids.
fn deliveries_of_key(subscription_id: &str) -> String {
    format!("{OUTBOX}deliveries-of:{subscription_id}")
}

/// A subscription's latest attempts, newest first: a list.
fn attempts_key(subscription_id: &str) -> String {
    format!("{OUTBOX}attempts:{subscription_id}")
}

/// A delivery's id; the length prefix keeps the event and subscription ids apart whatever
/// they contain.
fn delivery_id(event_id: &str, subscription_id: &str) -> String {
    format!("{}:{event_id}:{subscription_id}", event_id.len())
}

/// A delivery's hash.
fn delivery_key(delivery_id: &str) -> String {
    format!("{OUTBOX}delivery:{delivery_id}")
}

/// A duration in whole milliseconds, zero included (a retry due at once).
fn whole_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch (negative before it).
fn epoch_millis(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_millis()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

fn epoch_time(millis: i64) -> SystemTime {
    let offset = Duration::from_millis(millis.unsigned_abs());
    if millis >= 0 {
        UNIX_EPOCH + offset
    } else {
        UNIX_EPOCH - offset
    }
}

/// An attempt as the log keeps it (JSON).
#[derive(serde::Serialize, serde::Deserialize)]
struct LoggedAttempt {
    event_id: String,
    at_ms: i64,
    status: Option<u16>,
    duration_ms: u64,
    error: Option<String>,
}

fn unreadable_event(what: &str) -> StoreError {
    StoreError::message(format!("unreadable event store entry: {what}"))
}

/// The fields of a subscription's hash.
fn subscription_fields(subscription: &StoredSubscription) -> Vec<(&'static str, Vec<u8>)> {
    let mut fields = vec![
        ("url", subscription.url.clone().into_bytes()),
        (
            "event_types",
            serde_json::to_vec(&subscription.event_types).unwrap_or_default(),
        ),
        ("secret", subscription.secret.to_vec()),
        (
            "created_at",
            epoch_millis(subscription.created_at)
                .to_string()
                .into_bytes(),
        ),
    ];
    if let Some(description) = &subscription.description {
        fields.push(("description", description.clone().into_bytes()));
    }
    if let Some((secret, until)) = &subscription.previous_secret {
        fields.push(("previous_secret", secret.to_vec()));
        fields.push((
            "previous_secret_until",
            epoch_millis(*until).to_string().into_bytes(),
        ));
    }
    if let Some(reason) = &subscription.disabled_reason {
        fields.push(("disabled_reason", reason.clone().into_bytes()));
    }
    if let Some(since) = subscription.failing_since {
        fields.push((
            "failing_since",
            epoch_millis(since).to_string().into_bytes(),
        ));
    }
    fields
}

/// A subscription from its hash's fields.
fn read_subscription(
    id: &str,
    mut fields: HashMap<String, Vec<u8>>,
) -> Result<StoredSubscription, StoreError> {
    let mut text = |name: &str| -> Result<Option<String>, StoreError> {
        fields
            .remove(name)
            .map(|bytes| String::from_utf8(bytes).map_err(|_| unreadable_event(name)))
            .transpose()
    };
    let time = |value: Option<String>, name: &str| -> Result<Option<SystemTime>, StoreError> {
        value
            .map(|value| {
                value
                    .parse()
                    .map(epoch_time)
                    .map_err(|_| unreadable_event(name))
            })
            .transpose()
    };
    let url = text("url")?.ok_or_else(|| unreadable_event("url"))?;
    let event_types = text("event_types")?.ok_or_else(|| unreadable_event("event_types"))?;
    let description = text("description")?;
    let created_at =
        time(text("created_at")?, "created_at")?.ok_or_else(|| unreadable_event("created_at"))?;
    let previous_until = time(text("previous_secret_until")?, "previous_secret_until")?;
    let disabled_reason = text("disabled_reason")?;
    let failing_since = time(text("failing_since")?, "failing_since")?;
    Ok(StoredSubscription {
        id: Arc::from(id),
        url,
        event_types: serde_json::from_str(&event_types)
            .map_err(|_| unreadable_event("event_types"))?,
        description,
        secret: fields
            .remove("secret")
            .ok_or_else(|| unreadable_event("secret"))?
            .into_boxed_slice(),
        previous_secret: fields
            .remove("previous_secret")
            .zip(previous_until)
            .map(|(secret, until)| (secret.into_boxed_slice(), until)),
        created_at,
        disabled_reason,
        failing_since,
    })
}

fn from_value<T: redis::FromRedisValue>(value: redis::Value) -> Result<T, StoreError> {
    redis::from_redis_value(value).map_err(|error| StoreError(Box::new(error)))
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
                save_subscription: Script::new(SAVE_SUBSCRIPTION),
                subscriptions: Script::new(SUBSCRIPTIONS),
                delete_subscription: Script::new(DELETE_SUBSCRIPTION),
                enqueue_event: Script::new(ENQUEUE_EVENT),
                claim_deliveries: Script::new(CLAIM_DELIVERIES),
                finish_attempt: Script::new(FINISH_ATTEMPT),
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
        finish: Finish<'_>,
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

impl Inner {
    async fn save_subscription(&self, subscription: &StoredSubscription) -> Result<(), StoreError> {
        let mut invocation = self
            .save_subscription
            .key(subscription_key(&subscription.id));
        invocation
            .key(subscriptions_key())
            .arg(&*subscription.id)
            .arg(epoch_millis(subscription.created_at));
        for (name, value) in subscription_fields(subscription) {
            invocation.arg(name).arg(value);
        }
        let _: i64 = invocation
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        Ok(())
    }

    async fn subscription(&self, id: &str) -> Result<Option<StoredSubscription>, StoreError> {
        let fields: HashMap<String, Vec<u8>> = redis::cmd("HGETALL")
            .arg(subscription_key(id))
            .query_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        if fields.is_empty() {
            return Ok(None);
        }
        read_subscription(id, fields).map(Some)
    }

    async fn subscriptions(&self) -> Result<Vec<StoredSubscription>, StoreError> {
        let reply: Vec<redis::Value> = self
            .subscriptions
            .key(subscriptions_key())
            .arg(subscription_key(""))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        let mut found = Vec::with_capacity(reply.len() / 2);
        let mut entries = reply.into_iter();
        while let (Some(id), Some(fields)) = (entries.next(), entries.next()) {
            let id: String = from_value(id)?;
            found.push(read_subscription(&id, from_value(fields)?)?);
        }
        Ok(found)
    }

    async fn delete_subscription(&self, id: &str) -> Result<bool, StoreError> {
        let deleted: i64 = self
            .delete_subscription
            .key(subscription_key(id))
            .key(subscriptions_key())
            .key(deliveries_of_key(id))
            .key(attempts_key(id))
            .key(due_key())
            .arg(id)
            .arg(delivery_key(""))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        Ok(deleted > 0)
    }

    async fn enqueue_event(
        &self,
        event: &OutboxEvent,
        subscription_ids: &[Arc<str>],
    ) -> Result<(), StoreError> {
        if subscription_ids.is_empty() {
            return Ok(());
        }
        let mut invocation = self.enqueue_event.key(due_key());
        invocation
            .arg(delivery_key(""))
            .arg(deliveries_of_key(""))
            .arg(&*event.event_id)
            .arg(&*event.event_type)
            .arg(event.body.as_ref());
        for subscription_id in subscription_ids {
            invocation
                .arg(&**subscription_id)
                .arg(delivery_id(&event.event_id, subscription_id));
        }
        let _: i64 = invocation
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        Ok(())
    }

    async fn claim_deliveries(
        &self,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        let limit = limit.min(CLAIM_BATCH);
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut invocation = self.claim_deliveries.key(due_key());
        invocation
            .arg(limit)
            .arg(whole_millis(lease))
            .arg(delivery_key(""));
        for _ in 0..limit {
            invocation.arg(uuid::Uuid::now_v7().to_string());
        }
        let reply: Vec<Vec<Vec<u8>>> = invocation
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        reply
            .into_iter()
            .map(|claim| {
                let [subscription_id, event_id, event_type, body, attempts, token] =
                    <[Vec<u8>; 6]>::try_from(claim).map_err(|_| unreadable_event("claim"))?;
                let text = |bytes: Vec<u8>, name: &str| {
                    String::from_utf8(bytes).map_err(|_| unreadable_event(name))
                };
                Ok(ClaimedDelivery {
                    subscription_id: Arc::from(text(subscription_id, "subscription_id")?),
                    event: OutboxEvent {
                        event_id: Arc::from(text(event_id, "event_id")?),
                        event_type: Arc::from(text(event_type, "event_type")?),
                        body: body.into(),
                    },
                    attempts: text(attempts, "attempts")?
                        .parse()
                        .map_err(|_| unreadable_event("attempts"))?,
                    claim: Arc::from(text(token, "claim")?),
                })
            })
            .collect()
    }

    async fn finish_attempt(
        &self,
        claimed: &ClaimedDelivery,
        attempt: &DeliveryAttempt,
        after: AfterAttempt,
    ) -> Result<(), StoreError> {
        let delivery = delivery_id(&claimed.event.event_id, &claimed.subscription_id);
        let logged = serde_json::to_vec(&LoggedAttempt {
            event_id: attempt.event_id.to_string(),
            at_ms: epoch_millis(attempt.at),
            status: attempt.status,
            duration_ms: whole_millis(attempt.duration),
            error: attempt.error.clone(),
        })
        .map_err(|error| StoreError(Box::new(error)))?;
        let (action, delay) = match after {
            AfterAttempt::Delivered | AfterAttempt::Failed => ("remove", 0),
            AfterAttempt::RetryIn(delay) => ("retry", whole_millis(delay)),
        };
        let _: i64 = self
            .finish_attempt
            .key(delivery_key(&delivery))
            .key(due_key())
            .key(deliveries_of_key(&claimed.subscription_id))
            .key(attempts_key(&claimed.subscription_id))
            .arg(&delivery)
            .arg(&*claimed.claim)
            .arg(logged)
            .arg(KEPT_ATTEMPTS)
            .arg(action)
            .arg(delay)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        Ok(())
    }

    async fn delivery_attempts(
        &self,
        subscription_id: &str,
        limit: usize,
    ) -> Result<Vec<DeliveryAttempt>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let last = isize::try_from(limit - 1).unwrap_or(isize::MAX);
        let entries: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(attempts_key(subscription_id))
            .arg(0)
            .arg(last)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(failed)?;
        entries
            .iter()
            .map(|entry| {
                let logged: LoggedAttempt =
                    serde_json::from_slice(entry).map_err(|_| unreadable_event("attempt"))?;
                Ok(DeliveryAttempt {
                    event_id: Arc::from(logged.event_id),
                    at: epoch_time(logged.at_ms),
                    status: logged.status,
                    duration: Duration::from_millis(logged.duration_ms),
                    error: logged.error,
                })
            })
            .collect()
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
        finish: Finish<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { within(self.timeout, self.inner.finish_key(key, finish, ttl)).await })
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
            let (_, stored) = Stored::of(Finish::Response(&outcome.response));
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

    fn keeps_events(&self) -> bool {
        true
    }

    fn save_subscription<'a>(
        &'a self,
        subscription: &'a StoredSubscription,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.save_subscription(subscription),
        ))
    }

    fn subscription<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredSubscription>, StoreError>> {
        Box::pin(within(self.timeout, self.inner.subscription(id)))
    }

    fn subscriptions(&self) -> BoxFuture<'_, Result<Vec<StoredSubscription>, StoreError>> {
        Box::pin(within(self.timeout, self.inner.subscriptions()))
    }

    fn delete_subscription<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(within(self.timeout, self.inner.delete_subscription(id)))
    }

    fn enqueue_event<'a>(
        &'a self,
        event: &'a OutboxEvent,
        subscription_ids: &'a [Arc<str>],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.enqueue_event(event, subscription_ids),
        ))
    }

    fn claim_deliveries(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<ClaimedDelivery>, StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.claim_deliveries(limit, lease),
        ))
    }

    fn finish_attempt<'a>(
        &'a self,
        claimed: &'a ClaimedDelivery,
        attempt: &'a DeliveryAttempt,
        after: AfterAttempt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.finish_attempt(claimed, attempt, after),
        ))
    }

    fn delivery_attempts<'a>(
        &'a self,
        subscription_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeliveryAttempt>, StoreError>> {
        Box::pin(within(
            self.timeout,
            self.inner.delivery_attempts(subscription_id, limit),
        ))
    }

    fn pending_deliveries(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(within(self.timeout, async move {
            redis::cmd("ZCARD")
                .arg(due_key())
                .query_async(&mut self.inner.connection.clone())
                .await
                .map_err(failed)
        }))
    }
}
