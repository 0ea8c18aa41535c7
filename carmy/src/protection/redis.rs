//! Rate limits kept in Redis, so replicas share one budget per caller.

use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::Script;
use redis::aio::ConnectionManager;

use super::rate_limit::{Decision, RateLimit, RateLimiter};
use crate::Error;
use crate::store::record::within;
use crate::store::{StoreError, StoreOptions};
use crate::tool_error::{ToolError, codes};

/// Counts one request in the key's fixed window (the key expires with the window, on the
/// server's clock) and answers the count and the milliseconds left in the window.
///
/// KEYS: the window. ARGV: window (ms).
const COUNT: &str = r"
local count = redis.call('INCR', KEYS[1])
if count == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
local left = redis.call('PTTL', KEYS[1])
if left < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  left = tonumber(ARGV[1])
end
return {count, left}
";

/// The rate limiter replicas share: one atomic Lua script per request on a key that expires
/// with its window. Keys are hash-tagged (`carmy:rate:{…}`) so each lives in one cluster slot.
/// Every check has the time limits of its [`StoreOptions`]; when Redis does not answer in
/// time, the call is refused with a retryable `503 RATE_LIMITER_UNAVAILABLE`.
pub struct RedisRateLimiter {
    connection: ConnectionManager,
    count: Script,
    timeout: Duration,
}

impl std::fmt::Debug for RedisRateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRateLimiter").finish_non_exhaustive()
    }
}

impl RedisRateLimiter {
    /// Connects to the server at `url` (`redis://host:port/db`, or `rediss://` for TLS).
    /// Fails if the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, StoreOptions::new()).await
    }

    /// Like [`RedisRateLimiter::connect`], with the time limits and certificates of `options`.
    pub async fn connect_with(url: &str, options: StoreOptions) -> Result<Self, Error> {
        let (connection, _, options) =
            crate::store::redis::open(url, &options)
                .await
                .map_err(|error| Error::Unavailable {
                    service: "the Redis rate limiter",
                    source: error.into_source(),
                })?;
        Ok(RedisRateLimiter {
            connection,
            count: Script::new(COUNT),
            timeout: options.command_timeout,
        })
    }

    async fn count(&self, key: &str, limit: RateLimit) -> Result<Decision, StoreError> {
        let window_ms = u64::try_from(limit.window.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let (count, left_ms): (u64, u64) = self
            .count
            .key(format!("carmy:rate:{{{key}}}:{window_ms}"))
            .arg(window_ms)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(StoreError::new)?;
        Ok(if count > u64::from(limit.requests) {
            Decision::Limited {
                retry_after: Duration::from_millis(left_ms),
            }
        } else {
            Decision::Allowed
        })
    }
}

impl RateLimiter for RedisRateLimiter {
    fn check<'a>(
        &'a self,
        key: &'a str,
        limit: RateLimit,
    ) -> BoxFuture<'a, Result<Decision, ToolError>> {
        Box::pin(async move {
            within(self.timeout, self.count(key, limit))
                .await
                .map_err(|error| {
                    ToolError::capacity(
                        codes::RATE_LIMITER_UNAVAILABLE,
                        "the rate limiter is unavailable",
                    )
                    .retryable(Duration::from_secs(1))
                    .with_source(error)
                })
        })
    }

    fn ping(&self) -> Option<BoxFuture<'_, Result<(), Box<dyn std::error::Error + Send + Sync>>>> {
        Some(Box::pin(async move {
            redis::cmd("PING")
                .query_async::<()>(&mut self.connection.clone())
                .await
                .map_err(Into::into)
        }))
    }
}
