//! Per-caller request budgets: a fixed window per key, in process ([`MemoryRateLimiter`]) or
//! shared by replicas through Redis (`RedisRateLimiter`, with the `redis` feature).

use std::borrow::{Borrow, Cow};
use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
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

/// Whose budget a request spends.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RateKey<'a> {
    /// A known caller, by its principal's id.
    Principal(&'a str),
    /// An anonymous caller, by the address it connects from: `None` when served without
    /// connection info (plain `axum::serve`), where anonymous callers share one budget.
    Peer(Option<IpAddr>),
}

impl RateKey<'_> {
    /// The key as a host's [`RateLimiter`] receives it: text, of a caller or of an address.
    fn text(self) -> Cow<'static, str> {
        match self {
            // One allocation of the right size: `format!` would guess the size and grow it.
            RateKey::Principal(id) => Cow::Owned(["principal:", id].concat()),
            RateKey::Peer(Some(ip)) => Cow::Owned(format!("peer:{ip}")),
            RateKey::Peer(None) => Cow::Borrowed("peer:unknown"),
        }
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
    /// Counts one request of `key`, which arrived at `arrived`, against `limit`. The
    /// in-process limiter counts it in the window of its arrival, read by the gate: the clock
    /// is read once per request. It keeps callers by id and addresses as they are, where the
    /// host's limiter, with a clock of its own, gets them as text.
    pub(crate) async fn check(
        &self,
        key: RateKey<'_>,
        limit: RateLimit,
        arrived: Instant,
    ) -> Result<Decision, ToolError> {
        match self {
            Limiter::Memory(memory) => Ok(memory.count_key(key, limit, arrived)),
            Limiter::Host(limiter) => limiter.check(&key.text(), limit).await,
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

/// The maps are hashed by foldhash, seeded per process, rather than SipHash: a lookup on every
/// request. The keys an anonymous caller can choose are the addresses it connects from.
#[derive(Debug)]
struct Windows {
    /// Known callers by principal id, and the text keys of [`RateLimiter::check`].
    by_name: HashMap<Box<str>, Window, foldhash::quality::RandomState>,
    /// Anonymous callers by address, kept as it is: no key is formatted or allocated.
    by_peer: HashMap<Option<IpAddr>, Window, foldhash::quality::RandomState>,
    last_sweep: Instant,
}

impl Default for Windows {
    fn default() -> Self {
        Windows {
            by_name: HashMap::default(),
            by_peer: HashMap::default(),
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
        let windows = self.lock();
        windows.by_name.len() + windows.by_peer.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Windows> {
        // A panic while holding the lock leaves at worst a stale count: keep counting.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count_key(&self, key: RateKey<'_>, limit: RateLimit, now: Instant) -> Decision {
        let mut windows = self.lock();
        if now.duration_since(windows.last_sweep) >= limit.window {
            windows.by_name.retain(|_, window| window.ends > now);
            windows.by_peer.retain(|_, window| window.ends > now);
            windows.last_sweep = now;
        }
        match key {
            RateKey::Principal(id) => {
                count_in(&mut windows.by_name, id, |id| id.into(), limit, now)
            }
            RateKey::Peer(ip) => count_in(&mut windows.by_peer, &ip, |ip| *ip, limit, now),
        }
    }
}

/// Counts one request of `key` in its window of `windows`; `owned` makes the key of a caller
/// not tracked yet.
fn count_in<K, Q>(
    windows: &mut HashMap<K, Window, foldhash::quality::RandomState>,
    key: &Q,
    owned: fn(&Q) -> K,
    limit: RateLimit,
    now: Instant,
) -> Decision
where
    K: Eq + Hash + Borrow<Q>,
    Q: Eq + Hash + ?Sized,
{
    let fresh = Window {
        ends: now + limit.window,
        count: 0,
    };
    // Looked up by reference first: a key is made only for a caller not tracked yet.
    match windows.get_mut(key) {
        Some(window) => {
            if window.ends <= now {
                *window = fresh;
            }
            window.spend(limit, now)
        }
        None => {
            let mut window = fresh;
            let decision = window.spend(limit, now);
            windows.insert(owned(key), window);
            decision
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
        // A host's text key, kept by name as a known caller's id is.
        Box::pin(std::future::ready(Ok(self.count_key(
            RateKey::Principal(key),
            limit,
            Instant::now(),
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: RateLimit = RateLimit {
        requests: 1,
        window: Duration::from_secs(10),
    };

    #[test]
    fn callers_addresses_and_unknown_peers_each_have_a_budget_of_their_own() {
        let limiter = MemoryRateLimiter::new();
        let now = Instant::now();
        let peer = RateKey::Peer(Some([10, 0, 0, 1].into()));
        let keys = [
            RateKey::Principal("agent"),
            RateKey::Principal("10.0.0.1"),
            peer,
            RateKey::Peer(Some([10, 0, 0, 2].into())),
            RateKey::Peer(None),
        ];
        for key in keys {
            assert_eq!(limiter.count_key(key, LIMIT, now), Decision::Allowed);
        }
        for key in keys {
            assert_eq!(
                limiter.count_key(key, LIMIT, now + Duration::from_secs(4)),
                Decision::Limited {
                    retry_after: Duration::from_secs(6)
                },
            );
        }
        assert_eq!(limiter.tracked_keys(), keys.len());
        // The window counted from the request's arrival: the next one starts afresh, and the
        // sweep then drops every other key, of either kind.
        let later = now + LIMIT.window;
        assert_eq!(limiter.count_key(peer, LIMIT, later), Decision::Allowed);
        assert_eq!(limiter.tracked_keys(), 1);
    }
}
