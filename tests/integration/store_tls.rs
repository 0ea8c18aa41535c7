//! The shared stores over TLS, with rustls: PostgreSQL's `sslmode=require` and `verify-full`
//! against this machine's server (Debian's cluster serves TLS with its self-signed "snakeoil"
//! certificate for `localhost`), and `rediss://` against a Redis of the test's own with a
//! certificate from a private CA.

use std::sync::Arc;
use std::time::Duration;

use carmy::store::{
    Fingerprint, Finish, IdempotencyKey, KeyStore, RedisStore, Reservation, StoreOptions,
};
use carmy_tests::{Certificates, RedisServer, TempDir, run_id, server_url};

/// Reserve, finish, replay: the store works over this connection.
async fn round_trip(store: &dyn KeyStore, name: &str) {
    let key = IdempotencyKey::new(format!("tls-{}", run_id()), name);
    let fingerprint = Fingerprint::new("t", [1; 32]);
    let (execution_id, time) = (Arc::from("exec_tls"), Duration::from_secs(60));
    assert!(matches!(
        store
            .reserve(&key, &fingerprint, &execution_id, time, time)
            .await
            .unwrap(),
        Reservation::Reserved
    ));
    let response = carmy::store::StoredResponse::new(
        execution_id.clone(),
        carmy::ExecutionStatus::Completed,
        None,
        None,
        bytes::Bytes::from_static(b"{}"),
    );
    store
        .finish(&key, Finish::Response(&response), time)
        .await
        .unwrap();
    match store
        .reserve(&key, &fingerprint, &Arc::from("exec_2"), time, time)
        .await
        .unwrap()
    {
        Reservation::Finished(stored) => assert_eq!(stored, response),
        other => panic!("expected the recorded response, got {other:?}"),
    }
}

/// A plain connection to the test database, and the server's TLS certificate file.
async fn server_certificate(url: &str) -> (tokio_postgres::Client, String) {
    let client = carmy_tests::postgres::client(url).await;
    let ssl: String = client.query_one("SHOW ssl", &[]).await.unwrap().get(0);
    assert_eq!(
        ssl, "on",
        "the test PostgreSQL must serve TLS (Debian's default: ssl = on, snakeoil certificate)"
    );
    let file: String = client
        .query_one("SHOW ssl_cert_file", &[])
        .await
        .unwrap()
        .get(0);
    (client, file)
}

/// The store's connections, named by `application_name`, are encrypted.
async fn assert_encrypted(client: &tokio_postgres::Client, application: &str) {
    let row = client
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE s.ssl)
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.application_name = $1",
            &[&application],
        )
        .await
        .unwrap();
    let (all, encrypted): (i64, i64) = (row.get(0), row.get(1));
    assert!(all >= 1, "the store holds a connection");
    assert_eq!(encrypted, all, "every connection of the store is TLS");
}

#[tokio::test]
async fn postgres_sslmode_require_encrypts() {
    let Some(url) = server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    let (client, _) = server_certificate(&url).await;
    let application = format!("carmy-require-{}", std::process::id());
    let store = carmy::store::connect(&format!(
        "{url}?sslmode=require&application_name={application}"
    ))
    .await
    .expect("connects over TLS");
    round_trip(&*store, "require").await;
    assert_encrypted(&client, &application).await;
}

#[tokio::test]
async fn postgres_sslmode_verify_full_checks_the_certificate_and_the_name() {
    let Some(url) = server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    let (client, certificate) = server_certificate(&url).await;
    // The same server, by the name its certificate carries.
    let by_name = url.replace("127.0.0.1", "localhost");
    let application = format!("carmy-verify-{}", std::process::id());
    let store = carmy::store::connect(&format!(
        "{by_name}?sslmode=verify-full&sslrootcert={certificate}&application_name={application}"
    ))
    .await
    .expect("the certificate is trusted and names localhost");
    round_trip(&*store, "verify-full").await;
    assert_encrypted(&client, &application).await;

    // By another name than the certificate's: refused.
    let error = carmy::store::connect(&format!(
        "{url}?sslmode=verify-full&sslrootcert={certificate}"
    ))
    .await
    .err()
    .expect("127.0.0.1 is not a name of the certificate");
    let message = error.to_string();
    assert!(message.contains("not valid for name"), "{message}");
    // Against roots that did not sign it: refused.
    let dir = TempDir::new("pg-other-ca");
    let other = Certificates::make(&dir.0);
    let error = carmy::store::connect_with(
        &format!("{by_name}?sslmode=verify-full"),
        StoreOptions::new().root_certificates_pem(std::fs::read(&other.ca).unwrap()),
    )
    .await
    .err()
    .expect("a certificate no trusted CA signed");
    let message = error.to_string();
    assert!(message.contains("UnknownIssuer"), "{message}");
}

#[tokio::test]
async fn redis_over_tls_with_a_private_ca() {
    let dir = TempDir::new("redis-tls");
    let certificates = Certificates::make(&dir.0);
    let (certificate, key, ca) = (
        certificates.certificate.to_str().unwrap(),
        certificates.key.to_str().unwrap(),
        certificates.ca.to_str().unwrap(),
    );
    let server = RedisServer::start(
        &dir.0,
        true,
        &[
            "--tls-cert-file",
            certificate,
            "--tls-key-file",
            key,
            "--tls-ca-cert-file",
            ca,
            "--tls-auth-clients",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
    );
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let store = RedisStore::connect_with(
        &url,
        StoreOptions::new().root_certificates_pem(std::fs::read(ca).unwrap()),
    )
    .await
    .expect("connects over TLS, trusting the private CA");
    round_trip(&store, "rediss").await;
    // The same through `connect`, the CA named in the URL.
    let store = carmy::store::connect(&format!("{url}?sslrootcert={ca}"))
        .await
        .expect("connects over TLS, trusting the CA of sslrootcert");
    round_trip(&*store, "rediss-url").await;
    // Without the CA, the server's certificate is not trusted.
    let refused = RedisStore::connect_with(
        &url,
        StoreOptions::new()
            .acquire_timeout(Duration::from_secs(2))
            .command_timeout(Duration::from_secs(2)),
    )
    .await
    .expect_err("a certificate from an unknown CA was accepted");
    let message = refused.to_string();
    assert!(message.contains("UnknownIssuer"), "{message}");
}
