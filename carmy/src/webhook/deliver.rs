//! Delivery attempts: one signed POST to a subscriber, judged by its status.

use std::error::Error as _;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use reqwest::{Client, Response, StatusCode, redirect};
use tokio::time::Instant;

use super::SigningSecret;
use super::signature::sign;
use super::ssrf::{self, AllowedNetworks, Refusal};
use crate::tls;

/// How much of a response body is read: receivers answer with a status, and one answering
/// endlessly must not hold an attempt (or memory).
const READ_LIMIT: usize = 64 * 1024;
const USER_AGENT: &str = concat!("carmy/", env!("CARGO_PKG_VERSION"));

/// How attempts are made: from the `[events]` configuration.
#[derive(Debug, Clone)]
pub struct DeliveryPolicy {
    /// Send to `http://` URLs too (tests, receivers on a trusted network).
    pub allow_http: bool,
    /// Networks webhooks may reach although they are not global.
    pub allowed: AllowedNetworks,
    /// The longest an attempt may take, from resolving the host to reading the answer.
    pub attempt_timeout: Duration,
}

impl Default for DeliveryPolicy {
    fn default() -> Self {
        DeliveryPolicy {
            allow_http: false,
            allowed: AllowedNetworks::default(),
            attempt_timeout: Duration::from_secs(15),
        }
    }
}

/// Makes delivery attempts: one HTTP client (rustls with ring, no redirects followed, no proxy,
/// no cookies) whose DNS resolver is the SSRF guard. It resolves the host, refuses the whole
/// lookup if any address is refused, and hands the checked addresses to the connector, so the
/// connection goes to a checked address with no second lookup (DNS rebinding). IP-literal
/// hosts go through no resolver: they are checked before sending.
///
/// The client, and with it the platform's root certificates, is made at the first attempt: a
/// process that never sends a webhook never reads them (milliseconds of start-up and the pages
/// of the code that parses them), and a system without any (a `scratch` image) still starts;
/// its attempts then fail, saying why.
#[derive(Debug, Clone)]
pub struct Deliverer {
    /// The client, or why it could not be made; shared by the clones.
    client: Arc<OnceLock<Result<Client, String>>>,
    policy: Arc<DeliveryPolicy>,
}

impl Deliverer {
    /// A deliverer trusting the platform's root certificates.
    pub fn new(policy: DeliveryPolicy) -> Self {
        Deliverer {
            client: Arc::default(),
            policy: Arc::new(policy),
        }
    }

    /// The HTTP client, made the first time it is needed.
    fn client(&self) -> Result<&Client, String> {
        self.client
            .get_or_init(|| client_for(&self.policy))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The creation-time check of a subscription URL: scheme, host, resolution, every address.
    pub async fn check_url(&self, url: &str) -> Result<(), Refusal> {
        ssrf::check_url(url, self.policy.allow_http, &self.policy.allowed).await
    }

    /// One attempt: POST `body` (`application/json`) signed for `secrets`, stamped now, within
    /// the attempt timeout; at most 64 KiB of the answer's body is read.
    pub async fn attempt(
        &self,
        url: &str,
        secrets: &[&SigningSecret],
        event_id: &str,
        body: &[u8],
    ) -> Attempt {
        let at = SystemTime::now();
        let started = Instant::now();
        let deadline = started + self.policy.attempt_timeout;
        let answer = tokio::time::timeout_at(deadline, self.send(url, secrets, event_id, body, at))
            .await
            .unwrap_or_else(|_| Err(self.timed_out()));
        let mut response = match answer {
            Ok(response) => response,
            Err(error) => {
                return Attempt {
                    at,
                    status: None,
                    duration: started.elapsed(),
                    error: Some(error),
                    outcome: AttemptOutcome::Failed { retry_after: None },
                };
            }
        };
        let status = response.status();
        let (outcome, error) = judge(status, response.headers());
        // The status is the answer: the body is read only to end the exchange cleanly.
        let _ = tokio::time::timeout_at(deadline, read_at_most(&mut response, READ_LIMIT)).await;
        Attempt {
            at,
            status: Some(status.as_u16()),
            duration: started.elapsed(),
            error,
            outcome,
        }
    }

    async fn send(
        &self,
        url: &str,
        secrets: &[&SigningSecret],
        event_id: &str,
        body: &[u8],
        at: SystemTime,
    ) -> Result<Response, String> {
        let url = ssrf::check_without_dns(url, self.policy.allow_http, &self.policy.allowed)
            .map_err(|refusal| refusal.to_string())?;
        let timestamp = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        self.client()?
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .header("webhook-id", event_id)
            .header("webhook-timestamp", timestamp)
            .header(
                "webhook-signature",
                sign(secrets, event_id, timestamp, body),
            )
            .body(body.to_vec())
            .send()
            .await
            .map_err(describe)
    }

    fn timed_out(&self) -> String {
        format!(
            "timed out after {}",
            humantime::format_duration(self.policy.attempt_timeout)
        )
    }
}

/// The client of `policy`: rustls trusting the platform's root certificates, the SSRF guard as
/// its resolver; or why it cannot be made (no root certificates on this system, most likely).
fn client_for(policy: &Arc<DeliveryPolicy>) -> Result<Client, String> {
    let cannot = |error: &dyn std::fmt::Display| format!("webhook delivery cannot start: {error}");
    let roots = tls::native_roots().map_err(|none| cannot(&none))?;
    let tls = rustls::ClientConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| cannot(&error))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Client::builder()
        .tls_backend_preconfigured(tls)
        .dns_resolver(GuardedResolver(Arc::clone(policy)))
        .redirect(redirect::Policy::none())
        .no_proxy()
        .https_only(!policy.allow_http)
        .user_agent(USER_AGENT)
        .build()
        .map_err(|error| cannot(&error))
}

/// What came of one delivery attempt, as a subscription's delivery log shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// When it started; its `webhook-timestamp`.
    pub at: SystemTime,
    /// The receiver's status code, if it answered.
    pub status: Option<u16>,
    /// How long it took.
    pub duration: Duration,
    /// What went wrong, in a few words (never the secret).
    pub error: Option<String>,
    /// What the caller does next.
    pub outcome: AttemptOutcome,
}

/// How an attempt ended, for the caller to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// A 2xx answer: the event is delivered.
    Delivered,
    /// `410 Gone`: the receiver wants no more; the caller disables the subscription.
    Gone,
    /// Anything else: a 3xx (redirects are not followed), another 4xx or 5xx, a timeout, a
    /// connection error, an SSRF refusal. `retry_after` is the receiver's `Retry-After` on a
    /// 429 or 503.
    Failed {
        /// How long the receiver asked to wait before the next attempt.
        retry_after: Option<Duration>,
    },
}

/// What an answer means for the subscription, and the error its delivery log shows.
fn judge(status: StatusCode, headers: &HeaderMap) -> (AttemptOutcome, Option<String>) {
    let code = status.as_u16();
    let failed = AttemptOutcome::Failed { retry_after: None };
    match code {
        200..=299 => (AttemptOutcome::Delivered, None),
        410 => (AttemptOutcome::Gone, Some("HTTP 410".to_owned())),
        300..=399 => (failed, Some(format!("redirect not followed (HTTP {code})"))),
        429 | 503 => (
            AttemptOutcome::Failed {
                retry_after: retry_after(headers, SystemTime::now()),
            },
            Some(format!("HTTP {code}")),
        ),
        _ => (failed, Some(format!("HTTP {code}"))),
    }
}

/// `Retry-After` as seconds or an HTTP date (a past date: no wait).
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse() {
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or_default())
}

/// Reads until the body ends or `limit` bytes came, keeping none of it.
async fn read_at_most(response: &mut Response, limit: usize) {
    let mut read = 0;
    while read < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => read += chunk.len(),
            Ok(None) | Err(_) => return,
        }
    }
}

/// The error and its causes, without the URL; an SSRF refusal by the resolver is said as such.
fn describe(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut description = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        if let Some(refusal) = cause.downcast_ref::<Refusal>() {
            return refusal.to_string();
        }
        let _ = write!(description, ": {cause}");
        source = cause.source();
    }
    description
}

/// The client's DNS resolver: the addresses it returns are the ones connected to, all checked.
struct GuardedResolver(Arc<DeliveryPolicy>);

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = Arc::clone(&self.0);
        Box::pin(async move {
            let addresses = ssrf::resolve_checked(name.as_str(), &policy.allowed).await?;
            Ok(Box::new(addresses.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::net::SocketAddr;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::body::{Body, Bytes};
    use axum::http::{HeaderValue, StatusCode};
    use axum::response::{IntoResponse, Response as AxumResponse};
    use axum::routing::{any, post};
    use tokio::sync::oneshot;

    use super::*;
    use crate::webhook::verify;

    /// Loopback receivers are allowed here: every test receiver listens on 127.0.0.1.
    fn loopback_policy() -> DeliveryPolicy {
        DeliveryPolicy {
            allow_http: true,
            allowed: AllowedNetworks::parse(&["127.0.0.0/8"]).unwrap(),
            ..DeliveryPolicy::default()
        }
    }

    async fn serve(router: Router) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        address
    }

    /// A receiver answering every POST to `/hook` with `answer`, counting what it received.
    async fn answering(answer: AxumResponse<Body>) -> (SocketAddr, Arc<AtomicUsize>) {
        let answer = Arc::new(Mutex::new(Some(answer)));
        let received = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&received);
        let router = Router::new().route(
            "/hook",
            post(move || async move {
                counter.fetch_add(1, Ordering::SeqCst);
                answer.lock().unwrap().take().unwrap_or_default()
            }),
        );
        (serve(router).await, received)
    }

    /// A listener that never accepts: whether anything connected shows in its queue.
    fn untouched_listener() -> (std::net::TcpListener, u16) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        (listener, port)
    }

    fn assert_nothing_connected(listener: &std::net::TcpListener) {
        let error = listener.accept().map(|(_, peer)| peer).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::WouldBlock);
    }

    fn secret() -> SigningSecret {
        SigningSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()
    }

    async fn attempt(deliverer: &Deliverer, url: &str) -> Attempt {
        deliverer.attempt(url, &[&secret()], "evt_1", b"{}").await
    }

    #[tokio::test]
    async fn a_delivery_carries_the_standard_webhooks_headers_and_the_exact_body() {
        let received = Arc::new(Mutex::new(None));
        let keep = Arc::clone(&received);
        let router = Router::new().route(
            "/hook",
            post(move |headers: HeaderMap, body: Bytes| async move {
                *keep.lock().unwrap() = Some((headers, body));
                StatusCode::NO_CONTENT
            }),
        );
        let address = serve(router).await;
        let deliverer = Deliverer::new(loopback_policy());
        let url = format!("http://{address}/hook");
        assert_eq!(deliverer.check_url(&url).await, Ok(()));

        let (old, new) = (secret(), SigningSecret::generate());
        let body = "{\"type\":\"tools.changed\",\"data\":{\"note\":\"caf\u{e9} \u{2713}\"}}\n";
        let attempt = deliverer
            .attempt(&url, &[&old, &new], "evt_01J9", body.as_bytes())
            .await;

        assert_eq!(attempt.outcome, AttemptOutcome::Delivered);
        assert_eq!((attempt.status, attempt.error), (Some(204), None));
        let (headers, received) = received.lock().unwrap().take().unwrap();
        assert_eq!(received, body.as_bytes());
        let header = |name: &str| headers.get(name).unwrap().to_str().unwrap().to_owned();
        assert_eq!(header("content-type"), "application/json");
        assert_eq!(header("user-agent"), USER_AGENT);
        assert_eq!(header("webhook-id"), "evt_01J9");
        let timestamp: u64 = header("webhook-timestamp").parse().unwrap();
        let at = attempt.at.duration_since(UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(timestamp, at);
        let signature = header("webhook-signature");
        assert_eq!(signature.split(' ').count(), 2);
        for secret in [&old, &new] {
            assert!(verify(
                secret,
                "evt_01J9",
                timestamp,
                body.as_bytes(),
                &signature
            ));
        }
        assert!(!signature.contains(&old.to_whsec()["whsec_".len()..]));
    }

    #[tokio::test]
    async fn a_redirect_is_a_failure_and_is_not_followed() {
        let followed = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&followed);
        let router = Router::new()
            .route(
                "/hook",
                post(|| async { (StatusCode::FOUND, [("location", "/elsewhere")]) }),
            )
            .route(
                "/elsewhere",
                any(move || async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    StatusCode::OK
                }),
            );
        let address = serve(router).await;
        let deliverer = Deliverer::new(loopback_policy());

        let attempt = attempt(&deliverer, &format!("http://{address}/hook")).await;

        assert_eq!(
            attempt.outcome,
            AttemptOutcome::Failed { retry_after: None }
        );
        assert_eq!(attempt.status, Some(302));
        assert_eq!(
            attempt.error.as_deref(),
            Some("redirect not followed (HTTP 302)")
        );
        assert_eq!(followed.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn gone_asks_for_the_subscription_to_be_disabled() {
        let (address, received) = answering(StatusCode::GONE.into_response()).await;
        let deliverer = Deliverer::new(loopback_policy());

        let attempt = attempt(&deliverer, &format!("http://{address}/hook")).await;

        assert_eq!(attempt.outcome, AttemptOutcome::Gone);
        assert_eq!(attempt.status, Some(410));
        assert_eq!(received.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn retry_after_is_honoured_on_429_and_503_only() {
        let deliverer = Deliverer::new(loopback_policy());
        let seven = Some(Duration::from_secs(7));
        for (status, expected) in [
            (StatusCode::TOO_MANY_REQUESTS, seven),
            (StatusCode::SERVICE_UNAVAILABLE, seven),
            (StatusCode::INTERNAL_SERVER_ERROR, None),
            (StatusCode::BAD_REQUEST, None),
        ] {
            let answer = (status, [("retry-after", "7")]).into_response();
            let (address, _) = answering(answer).await;
            let attempt = attempt(&deliverer, &format!("http://{address}/hook")).await;
            let code = status.as_u16();
            assert_eq!(
                attempt.outcome,
                AttemptOutcome::Failed {
                    retry_after: expected
                }
            );
            assert_eq!(attempt.status, Some(code));
            assert_eq!(attempt.error, Some(format!("HTTP {code}")));
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = SystemTime::now();
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
            retry_after(&headers, now)
        };
        assert_eq!(with("0"), Some(Duration::ZERO));
        assert_eq!(with(" 120 "), Some(Duration::from_secs(120)));
        let in_two_minutes = httpdate::fmt_http_date(now + Duration::from_secs(120));
        let wait = with(&in_two_minutes).unwrap();
        assert!(
            wait > Duration::from_secs(118) && wait <= Duration::from_secs(120),
            "{wait:?}"
        );
        assert_eq!(with("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
        assert_eq!(with("-5"), None);
        assert_eq!(with("soon"), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[tokio::test]
    async fn a_receiver_that_never_answers_fails_after_the_attempt_timeout() {
        let router = Router::new().route("/hook", post(std::future::pending::<()>));
        let address = serve(router).await;
        let deliverer = Deliverer::new(DeliveryPolicy {
            attempt_timeout: Duration::from_millis(300),
            ..loopback_policy()
        });

        let attempt = attempt(&deliverer, &format!("http://{address}/hook")).await;

        assert_eq!(
            attempt.outcome,
            AttemptOutcome::Failed { retry_after: None }
        );
        assert_eq!(attempt.status, None);
        assert_eq!(attempt.error.as_deref(), Some("timed out after 300ms"));
    }

    /// Ends an endless body's count when the receiver's connection is given up.
    struct Abandoned(Option<oneshot::Sender<()>>);

    impl Drop for Abandoned {
        fn drop(&mut self) {
            if let Some(abandoned) = self.0.take() {
                let _ = abandoned.send(());
            }
        }
    }

    #[tokio::test]
    async fn an_endless_response_body_is_not_read_past_64_kib() {
        let (abandoned, given_up) = oneshot::channel();
        let abandoned = Arc::new(Mutex::new(Some(abandoned)));
        let router = Router::new().route(
            "/hook",
            post(move || async move {
                let guard = Abandoned(abandoned.lock().unwrap().take());
                let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
                let endless = futures_util::stream::unfold(guard, move |guard| {
                    let chunk = chunk.clone();
                    async move { Some((Ok::<_, Infallible>(chunk), guard)) }
                });
                Body::from_stream(endless)
            }),
        );
        let address = serve(router).await;
        // Only the body could make the attempt last: reading it all would never end.
        let deliverer = Deliverer::new(DeliveryPolicy {
            attempt_timeout: Duration::from_secs(600),
            ..loopback_policy()
        });

        let attempt = tokio::time::timeout(
            Duration::from_secs(60),
            attempt(&deliverer, &format!("http://{address}/hook")),
        )
        .await
        .expect("the attempt stops reading the body");

        assert_eq!(attempt.outcome, AttemptOutcome::Delivered);
        assert_eq!((attempt.status, attempt.error), (Some(200), None));
        tokio::time::timeout(Duration::from_secs(60), given_up)
            .await
            .expect("the deliverer closes the connection")
            .unwrap();
    }

    #[tokio::test]
    async fn loopback_is_refused_by_default_and_nothing_connects() {
        let (listener, port) = untouched_listener();
        let deliverer = Deliverer::new(DeliveryPolicy {
            allow_http: true,
            ..DeliveryPolicy::default()
        });
        let url = format!("http://127.0.0.1:{port}/hook");
        let refusal = Refusal::NotGlobal {
            address: "127.0.0.1".parse().unwrap(),
            range: "loopback",
        };

        assert_eq!(deliverer.check_url(&url).await, Err(refusal.clone()));
        let attempt = attempt(&deliverer, &url).await;

        assert_eq!(
            attempt.outcome,
            AttemptOutcome::Failed { retry_after: None }
        );
        assert_eq!(attempt.status, None);
        assert_eq!(attempt.error, Some(refusal.to_string()));
        assert_nothing_connected(&listener);
    }

    #[tokio::test]
    async fn http_is_refused_without_allow_http() {
        let (listener, port) = untouched_listener();
        let deliverer = Deliverer::new(DeliveryPolicy {
            allow_http: false,
            ..loopback_policy()
        });
        let url = format!("http://127.0.0.1:{port}/hook");

        assert_eq!(deliverer.check_url(&url).await, Err(Refusal::NotHttps));
        let attempt = attempt(&deliverer, &url).await;

        assert_eq!(
            attempt.outcome,
            AttemptOutcome::Failed { retry_after: None }
        );
        assert_eq!(attempt.error, Some(Refusal::NotHttps.to_string()));
        assert_nothing_connected(&listener);
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_at_check_and_at_attempt() {
        let (listener, port) = untouched_listener();
        let deliverer = Deliverer::new(DeliveryPolicy {
            allow_http: true,
            ..DeliveryPolicy::default()
        });
        let url = format!("http://localhost:{port}/hook");

        let refusal = deliverer.check_url(&url).await.unwrap_err();
        assert!(
            matches!(
                refusal,
                Refusal::NotGlobal {
                    range: "loopback",
                    ..
                }
            ),
            "{refusal:?}"
        );
        let attempt = attempt(&deliverer, &url).await;

        assert_eq!(
            attempt.outcome,
            AttemptOutcome::Failed { retry_after: None }
        );
        assert_eq!(attempt.status, None);
        let error = attempt.error.unwrap();
        assert!(
            error.contains("(loopback), which webhooks may not reach"),
            "{error}"
        );
        assert_nothing_connected(&listener);
    }

    #[tokio::test]
    async fn private_and_metadata_literals_are_refused_before_sending() {
        let deliverer = Deliverer::new(DeliveryPolicy {
            allow_http: true,
            ..DeliveryPolicy::default()
        });
        for (url, range) in [
            ("http://10.0.0.1:9/hook", "private"),
            ("https://192.168.1.1/hook", "private"),
            ("http://169.254.169.254/latest/meta-data/", "metadata"),
            ("https://[fd00:ec2::254]/hook", "metadata"),
            ("https://[::ffff:10.0.0.1]/hook", "private"),
        ] {
            let refusal = deliverer.check_url(url).await.unwrap_err();
            assert!(
                matches!(refusal, Refusal::NotGlobal { range: r, .. } if r == range),
                "{url}"
            );
            let attempt = attempt(&deliverer, url).await;
            assert_eq!(attempt.error, Some(refusal.to_string()), "{url}");
            assert_eq!(attempt.status, None);
        }
    }

    #[tokio::test]
    async fn a_closed_port_fails_with_the_connection_error() {
        let (listener, port) = untouched_listener();
        drop(listener);
        let deliverer = Deliverer::new(loopback_policy());

        let attempt = attempt(&deliverer, &format!("http://127.0.0.1:{port}/hook")).await;

        assert_eq!(
            attempt.outcome,
            AttemptOutcome::Failed { retry_after: None }
        );
        assert_eq!(attempt.status, None);
        let error = attempt.error.unwrap();
        assert!(error.contains("onnect"), "{error}");
        assert!(!error.contains("127.0.0.1"), "{error}");
    }
}
