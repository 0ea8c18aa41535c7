//! The Lua scripts: each transition one script on one hash (or on keys of one hash tag), so no
//! interleaving of replicas loses a change. Loaded once per store.

/// Claims a free key (create + expiry, atomically, like `SET NX PX`), or reads the record
/// that holds it, turning a running record whose lease has passed into an uncertain one.
/// Times are the server's clock.
///
/// A running record lives until its lease, whatever the ttl, then as an uncertain one for the
/// ttl.
///
/// KEYS: the record. ARGV: execution id, tool, digest, lease (ms), ttl (ms).
pub(super) const RESERVE: &str = r"
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
pub(super) const FINISH: &str = r"
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
pub(super) const RELEASE: &str = r"
if redis.call('HGET', KEYS[1], 'execution_id') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Keeps a running execution (`protocol.md` §9) until its lease.
///
/// KEYS: the execution. ARGV: caller, tool, lease (ms).
pub(super) const BEGIN_EXECUTION: &str = r"
redis.call('HSET', KEYS[1], 'caller', ARGV[1], 'tool', ARGV[2], 'cancel', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
";

/// Adds a progress event (`<id> <data>`) to a running execution, keeping the latest ones, and
/// announces it.
///
/// KEYS: the execution, its events. ARGV: event id, data, how many to keep, execution id.
pub(super) const RECORD_PROGRESS: &str = r"
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
pub(super) const END_EXECUTION: &str = r"
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
pub(super) const READ_EXECUTION: &str = r"
local r = redis.call('HMGET', KEYS[1], 'caller', 'tool', 'status', 'category', 'code', 'body',
  'final_event_id', 'cancel')
if r[1] ~= ARGV[1] then return {} end
return {r[2], r[3] or '', r[4] or '', r[5] or '', r[6] or '', r[7] or '', r[8],
  redis.call('LRANGE', KEYS[2], 0, -1)}
";

/// Marks a caller's running execution cancelled and announces it; says what it found.
///
/// KEYS: the execution. ARGV: caller, execution id.
pub(super) const CANCEL_EXECUTION: &str = r"
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
pub(super) const SAVE_SUBSCRIPTION: &str = r"
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
";

/// Every subscription, oldest first (by creation time, then id: the index's order): id and
/// fields (name, value, …) of each.
///
/// KEYS: the index of subscriptions. ARGV: the subscriptions' key prefix.
pub(super) const SUBSCRIPTIONS: &str = r"
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
pub(super) const DELETE_SUBSCRIPTION: &str = r"
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
pub(super) const ENQUEUE_EVENT: &str = r"
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
pub(super) const CLAIM_DELIVERIES: &str = r"
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
pub(super) const FINISH_ATTEMPT: &str = r"
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
