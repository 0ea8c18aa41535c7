//! What a configuration says about admitting requests (tokens, rate limits, origins, security
//! headers), and the rate limits themselves, counted in process or, shared by replicas, in
//! Redis. The HTTP gate applies them (`http::admission`).

mod rate_limit;
#[cfg(feature = "redis")]
mod redis;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::ConnectInfo;
use axum::http::HeaderMap;

use crate::auth::Authentication;
use crate::principal::{Principal, TrustLevel};
use crate::telemetry::Metrics;
use crate::wire::X_FORWARDED_FOR;

pub use rate_limit::{Decision, MemoryRateLimiter, RateLimit, RateLimiter};
pub(crate) use rate_limit::{Limiter, RateKey};
#[cfg(feature = "redis")]
pub use redis::RedisRateLimiter;

/// How requests are admitted; set through the [`App`](crate::App) builder or `carmy.toml`.
#[derive(Clone)]
pub(crate) struct Protection {
    pub(crate) authentication: Option<Authentication>,
    /// The budget of each trust level, indexed by [`TrustLevel::index`]; `None` is unlimited.
    pub(crate) limits: [Option<RateLimit>; 4],
    pub(crate) limiter: Limiter,
    /// Key anonymous callers by the last `X-Forwarded-For` address (set by a trusted proxy)
    /// instead of the peer address.
    pub(crate) trust_forwarded_for: bool,
    /// Browser origins allowed, one list for carmy/1's CORS, its `Origin` check of requests
    /// that change state, and MCP's, so a preflight never grants what the request is then
    /// refused; empty turns CORS off.
    pub(crate) cors_origins: Vec<String>,
    pub(crate) security_headers: bool,
    /// Counts refusals by a rate limit, when metrics are on.
    pub(crate) metrics: Option<Arc<Metrics>>,
}

impl Default for Protection {
    fn default() -> Self {
        Protection {
            authentication: None,
            limits: [None; 4],
            limiter: Limiter::Memory(MemoryRateLimiter::new()),
            trust_forwarded_for: false,
            cors_origins: Vec::new(),
            security_headers: false,
            metrics: None,
        }
    }
}

impl Protection {
    /// The key a caller's budget is counted under: the principal, or for anonymous callers
    /// the address they connect from.
    pub(crate) fn rate_key<'p>(
        &self,
        principal: &'p Principal,
        headers: &HeaderMap,
        extensions: &axum::http::Extensions,
    ) -> RateKey<'p> {
        if principal.trust() != TrustLevel::Anonymous {
            return RateKey::Principal(principal.id());
        }
        if self.trust_forwarded_for
            && let Some(forwarded) = last_forwarded_for(headers)
        {
            return RateKey::Peer(Some(forwarded));
        }
        // Served without connection info (plain `axum::serve`), anonymous callers share one
        // budget.
        let connected = extensions.get::<ConnectInfo<SocketAddr>>();
        RateKey::Peer(connected.map(|ConnectInfo(addr)| addr.ip()))
    }
}

/// The address the nearest proxy saw: the last entry of the last `X-Forwarded-For`.
fn last_forwarded_for(headers: &HeaderMap) -> Option<IpAddr> {
    let value = headers.get_all(&X_FORWARDED_FOR).iter().next_back()?;
    value.to_str().ok()?.rsplit(',').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn forwarded_for_takes_the_nearest_proxy() {
        let mut headers = HeaderMap::new();
        headers.append(
            &X_FORWARDED_FOR,
            HeaderValue::from_static("1.1.1.1, 2.2.2.2"),
        );
        assert_eq!(last_forwarded_for(&headers), Some([2, 2, 2, 2].into()));
        headers.append(&X_FORWARDED_FOR, HeaderValue::from_static("3.3.3.3"));
        assert_eq!(last_forwarded_for(&headers), Some([3, 3, 3, 3].into()));
    }
}
