//! Choosing a store by URL, from configuration or the environment.

use std::sync::Arc;

use super::{Engine, MemoryStore, StoreError, StoreOptions};

/// The environment variable [`connect_from_env`] reads.
pub const IDEMPOTENCY_URL_VAR: &str = "CARMY_IDEMPOTENCY_URL";

/// Opens the store that `url` names and checks that it answers, so that an unreachable store
/// is a start-up error rather than a failure of the first call:
///
/// - `postgres://…` or `postgresql://…`: [`PostgresStore`](super::PostgresStore) (feature
///   `postgres`);
/// - `redis://…` or `rediss://…`: [`RedisStore`](super::RedisStore) (feature `redis`);
/// - `file:PATH`: [`FileStore`](super::FileStore) (feature `file`);
/// - `memory:`: a [`MemoryStore`].
///
/// An unknown scheme, or one whose feature is not enabled, is an error. Shared stores take
/// carmy's query parameters `acquire_timeout` and `command_timeout` (see [`StoreOptions`]).
pub async fn connect(url: &str) -> Result<Arc<dyn Engine>, StoreError> {
    connect_with(url, StoreOptions::new()).await
}

/// [`connect`] with the time limits and certificates of `options` (the URL's parameters win).
pub async fn connect_with(url: &str, options: StoreOptions) -> Result<Arc<dyn Engine>, StoreError> {
    let Some((scheme, rest)) = url.split_once(':') else {
        return Err(StoreError::message(format!(
            "`{url}` is not a store URL: expected postgres://…, redis://…, file:PATH or memory:"
        )));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "memory" => Ok(Arc::new(MemoryStore::new())),
        "postgres" | "postgresql" => open_postgres(url, options).await,
        "redis" | "rediss" => open_redis(url, options).await,
        "file" => open_file(rest).await,
        other => Err(StoreError::message(format!(
            "unknown idempotency store scheme `{other}`: expected postgres, postgresql, redis, \
             rediss, file or memory"
        ))),
    }
}

/// [`connect`] to the URL in `CARMY_IDEMPOTENCY_URL`; a [`MemoryStore`] when it is unset.
pub async fn connect_from_env() -> Result<Arc<dyn Engine>, StoreError> {
    match std::env::var(IDEMPOTENCY_URL_VAR) {
        Ok(url) => connect(&url).await,
        Err(std::env::VarError::NotPresent) => Ok(Arc::new(MemoryStore::new())),
        Err(std::env::VarError::NotUnicode(_)) => Err(StoreError::message(format!(
            "{IDEMPOTENCY_URL_VAR} is not valid UTF-8"
        ))),
    }
}

#[cfg(not(all(feature = "postgres", feature = "redis", feature = "file")))]
fn feature_disabled(feature: &str, url: &str) -> StoreError {
    StoreError::message(format!(
        "`{url}` needs carmy's `{feature}` cargo feature, which this build does not enable"
    ))
}

#[cfg(feature = "postgres")]
async fn open_postgres(url: &str, options: StoreOptions) -> Result<Arc<dyn Engine>, StoreError> {
    Ok(Arc::new(
        super::PostgresStore::connect_with(url, options).await?,
    ))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(url: &str, _: StoreOptions) -> Result<Arc<dyn Engine>, StoreError> {
    Err(feature_disabled("postgres", url))
}

#[cfg(feature = "redis")]
async fn open_redis(url: &str, options: StoreOptions) -> Result<Arc<dyn Engine>, StoreError> {
    Ok(Arc::new(
        super::RedisStore::connect_with(url, options).await?,
    ))
}

#[cfg(not(feature = "redis"))]
async fn open_redis(url: &str, _: StoreOptions) -> Result<Arc<dyn Engine>, StoreError> {
    Err(feature_disabled("redis", url))
}

#[cfg(feature = "file")]
async fn open_file(path: &str) -> Result<Arc<dyn Engine>, StoreError> {
    if path.is_empty() {
        return Err(StoreError::message(
            "`file:` needs a path, as in file:/var/lib/app/idempotency.redb",
        ));
    }
    Ok(Arc::new(super::FileStore::open(path).await?))
}

#[cfg(not(feature = "file"))]
async fn open_file(path: &str) -> Result<Arc<dyn Engine>, StoreError> {
    Err(feature_disabled("file", &format!("file:{path}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unknown_schemes_and_non_urls_are_clear_errors() {
        for (url, expected) in [
            (
                "mysql://localhost/db",
                "unknown idempotency store scheme `mysql`",
            ),
            ("just-a-path", "is not a store URL"),
        ] {
            let error = connect(url).await.err().expect("an error");
            assert!(error.to_string().contains(expected), "{error}");
        }
        assert!(connect("memory:").await.is_ok());
    }
}
