//! Rate limits kept in Redis, so replicas share one budget per caller.

use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script};

use super::rate_limit::{Decision, RateLimit, RateLimiter};
use crate::tool_error::{ToolError, codes};

/// How long a command, or a connection attempt, may take before the limiter reports itself
/// unavailable.
const TIMEOUT: Duration = Duration::from_secs(5);

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
pub struct RedisRateLimiter {
    connection: ConnectionManager,
    count: Script,
}

impl std::fmt::Debug for RedisRateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRateLimiter").finish_non_exhaustive()
    }
}

impl RedisRateLimiter {
    /// Connects to the server at `url` (`redis://host:port/db`). Fails if the server cannot
    /// be reached.
    pub async fn connect(url: &str) -> Result<Self, RedisError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT))
            .set_number_of_retries(2);
        let connection = ConnectionManager::new_with_config(client, config).await?;
        Ok(RedisRateLimiter {
            connection,
            count: Script::new(COUNT),
        })
    }

    async fn count(&self, key: &str, limit: RateLimit) -> Result<Decision, RedisError> {
        let window_ms = u64::try_from(limit.window.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let (count, left_ms): (u64, u64) = self
            .count
            .key(format!("carmy:rate:{{{key}}}:{window_ms}"))
            .arg(window_ms)
            .invoke_async(&mut self.connection.clone())
            .await?;
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
            self.count(key, limit).await.map_err(|error| {
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
