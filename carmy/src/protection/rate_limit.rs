//! Per-caller request budgets: a fixed window per key, in process ([`MemoryRateLimiter`]) or
//! shared by replicas through Redis (`RedisRateLimiter`, with the `redis` feature).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use crate::tool_error::ToolError;

/// A budget: at most `requests` per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Requests allowed in one window (at least 1).
    pub requests: u32,
    /// The window's length.
    pub window: Duration,
}

/// Whether a request fits its caller's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The request may proceed.
    Allowed,
    /// The budget is spent; the window ends after this long.
    Limited {
        /// Until the window ends.
        retry_after: Duration,
    },
}

/// Counts the requests of each caller. Keys are opaque: the principal's id, or the peer address
/// of anonymous callers.
pub trait RateLimiter: Send + Sync + 'static {
    /// Counts one request of `key` against `limit`.
    fn check<'a>(
        &'a self,
        key: &'a str,
        limit: RateLimit,
    ) -> BoxFuture<'a, Result<Decision, ToolError>>;

    /// Checks that the limiter's backend answers, for the health checks (run in the
    /// background, never per request). `None`, the default, for a limiter in the process.
    fn ping(&self) -> Option<BoxFuture<'_, Result<(), Box<dyn std::error::Error + Send + Sync>>>> {
        None
    }
}

/// Where a protection counts: in process, answered at once, or the host's [`RateLimiter`]
/// (Redis), awaited (a boxed future on every request).
#[derive(Clone)]
pub(crate) enum Limiter {
    Memory(MemoryRateLimiter),
    Host(Arc<dyn RateLimiter>),
}

impl Limiter {
    /// Counts one request of `key` against `limit`.
    pub(crate) async fn check(&self, key: &str, limit: RateLimit) -> Result<Decision, ToolError> {
        match self {
            Limiter::Memory(memory) => Ok(memory.count(key, limit)),
            Limiter::Host(limiter) => limiter.check(key, limit).await,
        }
    }

    /// The host's limiter, whose backend the health checks ping.
    pub(crate) fn host(&self) -> Option<&Arc<dyn RateLimiter>> {
        match self {
            Limiter::Memory(_) => None,
            Limiter::Host(limiter) => Some(limiter),
        }
    }
}

/// The in-process limiter (the default). Memory stays bounded: a key whose window has passed is
/// evicted by the next sweep, which runs at most once per window.
#[derive(Debug, Clone, Default)]
pub struct MemoryRateLimiter {
    inner: Arc<Mutex<Windows>>,
}

#[derive(Debug)]
struct Windows {
    /// Hashed by foldhash, seeded per process, rather than SipHash: a lookup on every request.
    /// The keys an anonymous caller can choose are the addresses it connects from.
    by_key: HashMap<Box<str>, Window, foldhash::quality::RandomState>,
    last_sweep: Instant,
}

impl Default for Windows {
    fn default() -> Self {
        Windows {
            by_key: HashMap::default(),
            last_sweep: Instant::now(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Window {
    ends: Instant,
    count: u32,
}

impl MemoryRateLimiter {
    /// A limiter that tracks no key yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many callers are tracked now (evicted idle ones excluded).
    pub fn tracked_keys(&self) -> usize {
        self.lock().by_key.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Windows> {
        // A panic while holding the lock leaves at worst a stale count: keep counting.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count(&self, key: &str, limit: RateLimit) -> Decision {
        let now = Instant::now();
        let mut windows = self.lock();
        if now.duration_since(windows.last_sweep) >= limit.window {
            windows.by_key.retain(|_, window| window.ends > now);
            windows.last_sweep = now;
        }
        let fresh = Window {
            ends: now + limit.window,
            count: 0,
        };
        // Looked up by `&str` first: a key is allocated only for a caller not tracked yet.
        match windows.by_key.get_mut(key) {
            Some(window) => {
                if window.ends <= now {
                    *window = fresh;
                }
                window.spend(limit, now)
            }
            None => {
                let mut window = fresh;
                let decision = window.spend(limit, now);
                windows.by_key.insert(key.into(), window);
                decision
            }
        }
    }
}

impl Window {
    /// Counts one request unless the budget is spent.
    fn spend(&mut self, limit: RateLimit, now: Instant) -> Decision {
        if self.count >= limit.requests {
            return Decision::Limited {
                retry_after: self.ends - now,
            };
        }
        self.count += 1;
        Decision::Allowed
    }
}

impl RateLimiter for MemoryRateLimiter {
    fn check<'a>(
        &'a self,
        key: &'a str,
        limit: RateLimit,
    ) -> BoxFuture<'a, Result<Decision, ToolError>> {
        Box::pin(std::future::ready(Ok(self.count(key, limit))))
    }
}
