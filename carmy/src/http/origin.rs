//! Which browser origins may send a request that runs something or changes state. A page on
//! another site can make a browser send a "simple" request (a form, `fetch` with
//! `mode: "no-cors"`) without any preflight, and the browser names the page in `Origin`: carmy
//! serves such a request from the server's own origin or an allowed one only.

use axum::http::HeaderValue;
use axum::http::request::Parts;

use crate::tool_error::ToolError;
use crate::wire::codes;

/// `403 ORIGIN_NOT_ALLOWED`, for carmy/1 and MCP alike.
pub(crate) fn refused() -> ToolError {
    ToolError::permission(
        codes::ORIGIN_NOT_ALLOWED,
        "requests from this Origin are not allowed",
    )
    .recoverable(false)
}

/// carmy/1's rule: an allowed origin, or the server's own: the origin's host and port are the
/// request's authority (its `Host`). The scheme is not compared, since TLS may end at a proxy
/// in front; it gives the port an authority without one has.
pub(crate) fn same_or_allowed(origin: &HeaderValue, allowed: &[String], request: &Parts) -> bool {
    if listed(origin, allowed) {
        return true;
    }
    let authority = match request.uri.authority() {
        Some(authority) => authority.as_str().as_bytes(),
        None => match request.headers.get(axum::http::header::HOST) {
            Some(host) => host.as_bytes(),
            None => return false,
        },
    };
    let (Ok(origin), Ok(authority)) = (origin.to_str(), std::str::from_utf8(authority)) else {
        return false;
    };
    let Some((scheme, origin)) = split_origin(origin) else {
        return false;
    };
    let default_port = if scheme == "https" { 443 } else { 80 };
    match (split_authority(origin), split_authority(authority)) {
        (Some((host, port)), Some((server, server_port))) => {
            host.eq_ignore_ascii_case(server)
                && port.unwrap_or(default_port) == server_port.unwrap_or(default_port)
        }
        _ => false,
    }
}

/// MCP's rule: an allowed origin, or a loopback one (`http(s)://localhost|127.0.0.1|[::1]`,
/// any port). `null` and everything else are not.
#[cfg(feature = "mcp")]
pub(crate) fn loopback_or_allowed(origin: &HeaderValue, allowed: &[String]) -> bool {
    if listed(origin, allowed) {
        return true;
    }
    let Some((_, authority)) = origin.to_str().ok().and_then(split_origin) else {
        return false;
    };
    split_authority(authority).is_some_and(|(host, _)| {
        matches!(
            host.to_ascii_lowercase().as_str(),
            "localhost" | "127.0.0.1" | "::1"
        )
    })
}

/// One of the configured origins, compared as written, whatever the case.
fn listed(origin: &HeaderValue, allowed: &[String]) -> bool {
    allowed
        .iter()
        .any(|allowed| allowed.as_bytes().eq_ignore_ascii_case(origin.as_bytes()))
}

/// `http` or `https` (lowercase) and the authority of an origin such as `https://a.example:8443`.
fn split_origin(origin: &str) -> Option<(&'static str, &str)> {
    let (scheme, rest) = origin.split_once("://")?;
    let scheme = if scheme.eq_ignore_ascii_case("https") {
        "https"
    } else if scheme.eq_ignore_ascii_case("http") {
        "http"
    } else {
        return None;
    };
    Some((scheme, rest))
}

/// The host and port of an authority (`a.example`, `a.example:8080`, `[::1]:80`); `None` for
/// anything else, user information and paths included.
fn split_authority(authority: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once(']')?,
        None => authority.split_at(authority.find(':').unwrap_or(authority.len())),
    };
    let plain =
        |byte: u8| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'-' | b'_' | b':');
    if host.is_empty() || !host.bytes().all(plain) {
        return None;
    }
    let port = match port {
        "" => None,
        port => {
            let digits = port.strip_prefix(':')?;
            if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
                return None;
            }
            Some(digits.parse().ok()?)
        }
    };
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use axum::http::Request;

    use super::*;

    #[cfg(feature = "mcp")]
    #[test]
    fn loopback_and_listed_origins_are_allowed_to_mcp() {
        let listed = vec!["https://app.example.com".to_owned()];
        let allowed =
            |origin: &'static str| loopback_or_allowed(&HeaderValue::from_static(origin), &listed);
        assert!(allowed("http://localhost"));
        assert!(allowed("http://localhost:6274"));
        assert!(allowed("https://127.0.0.1:3000"));
        assert!(allowed("http://[::1]:8080"));
        assert!(allowed("HTTPS://APP.EXAMPLE.COM"));
        assert!(!allowed("http://evil.example"));
        assert!(!allowed("http://localhost.evil.example"));
        assert!(!allowed("http://localhost:80@evil.example"));
        assert!(!allowed("http://127.0.0.1.nip.io"));
        assert!(!allowed("null"));
        assert!(!allowed("file://"));
        assert!(!allowed("https://app.example.com:8443"));
    }

    fn head(host: Option<&str>, uri: &str) -> Parts {
        let mut request = Request::post(uri);
        if let Some(host) = host {
            request = request.header("host", host);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn the_servers_own_origin_is_its_host_with_either_scheme() {
        let listed = vec!["https://app.example.com".to_owned()];
        let allowed = |origin: &'static str, host: Option<&str>| {
            same_or_allowed(
                &HeaderValue::from_static(origin),
                &listed,
                &head(host, "/agent/execute"),
            )
        };
        let shop = Some("shop.example:8080");
        assert!(allowed("http://shop.example:8080", shop));
        assert!(allowed("https://SHOP.example:8080", shop));
        assert!(allowed("https://shop.example", Some("shop.example")));
        assert!(allowed("https://shop.example", Some("shop.example:443")));
        assert!(allowed("http://shop.example:80", Some("shop.example")));
        assert!(allowed("http://[::1]:3000", Some("[::1]:3000")));
        assert!(allowed("https://app.example.com", shop));
        assert!(allowed("https://app.example.com", None));
        // Another port, host or scheme's port is another origin.
        assert!(!allowed("http://shop.example:8081", shop));
        assert!(!allowed("http://shop.example", shop));
        assert!(!allowed("https://shop.example", Some("shop.example:80")));
        assert!(!allowed("http://evil.example:8080", shop));
        assert!(!allowed("http://127.0.0.1:8000", Some("127.0.0.1:3000")));
        assert!(!allowed("http://localhost:3000", Some("127.0.0.1:3000")));
        // Whatever does not parse as an origin is nobody's.
        assert!(!allowed("null", shop));
        assert!(!allowed("shop.example:8080", shop));
        assert!(!allowed("ftp://shop.example:8080", shop));
        assert!(!allowed("http://user@shop.example:8080", shop));
        assert!(!allowed("http://shop.example:8080/", shop));
        assert!(!allowed("http://shop.example:8080", None));
        assert!(!allowed("http://shop.example:", Some("shop.example:")));
        // An absolute URI (HTTP/2's `:authority`) is the request's authority.
        let absolute = head(None, "https://shop.example:8443/agent/execute");
        assert!(same_or_allowed(
            &HeaderValue::from_static("https://shop.example:8443"),
            &[],
            &absolute
        ));
        assert!(!same_or_allowed(
            &HeaderValue::from_static("https://evil.example:8443"),
            &[],
            &absolute
        ));
    }
}
