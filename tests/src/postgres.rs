//! PostgreSQL for the tests that need it: clients, and schemas of a test's own, so that tests
//! sharing one database never see each other's records.

/// A client of the database at `url`, its connection driven in the background.
pub async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|error| panic!("PostgreSQL at {url} is unreachable: {error}"));
    tokio::spawn(connection);
    client
}

/// `url`, its connections using `schema` (their `search_path`).
pub fn scoped(url: &str, schema: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-csearch_path%3D{schema}")
}

/// Creates `schema` at `url` unless it exists (the store migrates it): the URL that uses it.
pub async fn schema(url: &str, schema: &str) -> String {
    client(url)
        .await
        .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
        .await
        .unwrap_or_else(|error| panic!("schema {schema} cannot be created: {error}"));
    scoped(url, schema)
}

/// Creates `schema` at `url` afresh, dropping what an earlier run left in it: the URL that
/// uses it.
pub async fn fresh_schema(url: &str, schema: &str) -> String {
    drop_schema(url, schema).await;
    self::schema(url, schema).await
}

/// Drops `schema` at `url`, and everything in it.
pub async fn drop_schema(url: &str, schema: &str) {
    client(url)
        .await
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await
        .unwrap_or_else(|error| panic!("schema {schema} cannot be dropped: {error}"));
}
