//! Who a request is from (`protocol.md` §10): a person when `Accept` prefers `text/html`, as
//! browsers send it, unless `Carmy-Channel` says otherwise; an agent in every other case.

use axum::http::{HeaderMap, HeaderValue};

use super::accept::media_ranges;
use super::{Header, Present};
use crate::context::Requester;
use crate::tool_error::ToolError;
use crate::wire::CARMY_CHANNEL;

/// The headers a negotiated response varies on.
pub(crate) static VARY_REQUESTER: HeaderValue = HeaderValue::from_static("Accept, Carmy-Channel");

/// The requester of a request with `headers` (of which `present`); a `Carmy-Channel` that is
/// neither `human` nor `agent` (or sent twice) is refused rather than guessed.
pub(crate) fn requester(headers: &HeaderMap, present: Present) -> Result<Requester, ToolError> {
    if present.has(Header::CarmyChannel) {
        let mut channels = headers.get_all(&CARMY_CHANNEL).iter();
        return match (channels.next().map(HeaderValue::to_str), channels.next()) {
            (Some(Ok(value)), None) if value.trim().eq_ignore_ascii_case("human") => {
                Ok(Requester::Human)
            }
            (Some(Ok(value)), None) if value.trim().eq_ignore_ascii_case("agent") => {
                Ok(Requester::Agent)
            }
            _ => Err(ToolError::invalid_request(
                "Carmy-Channel must be `human` or `agent`, once",
            )),
        };
    }
    Ok(if present.has(Header::Accept) && prefers_html(headers) {
        Requester::Human
    } else {
        Requester::Agent
    })
}

/// Whether `Accept` names `text/html` itself and ranks it above JSON. Each type takes the
/// quality of the most specific range that matches it (RFC 9110 §12.5.1), so a browser's
/// `text/html,…,*/*;q=0.8` prefers HTML, while `*/*` alone, `application/json`, or HTML
/// ranked no higher than JSON do not.
fn prefers_html(headers: &HeaderMap) -> bool {
    let mut html = Ranked::default();
    let mut json = Ranked::default();
    let mut html_named = false;
    for (media, quality) in media_ranges(headers) {
        let Some((kind, subtype)) = media.split_once('/') else {
            continue;
        };
        if kind.eq_ignore_ascii_case("text") && subtype.eq_ignore_ascii_case("html") {
            html_named |= quality > 0.0;
        }
        html.offer(kind, subtype, ("text", "html"), quality);
        json.offer(kind, subtype, ("application", "json"), quality);
    }
    html_named && html.quality > json.quality
}

/// The quality a media type takes from the most specific range seen so far that matches it.
#[derive(Default)]
struct Ranked {
    /// 0: no range matched; 1: `*/*`; 2: `type/*`; 3: the type itself.
    specificity: u8,
    quality: f32,
}

impl Ranked {
    fn offer(
        &mut self,
        kind: &str,
        subtype: &str,
        (want_kind, want_subtype): (&str, &str),
        quality: f32,
    ) {
        let specificity = match (kind, subtype) {
            ("*", "*") => 1,
            (kind, "*") if kind.eq_ignore_ascii_case(want_kind) => 2,
            (kind, subtype)
                if kind.eq_ignore_ascii_case(want_kind)
                    && subtype.eq_ignore_ascii_case(want_subtype) =>
            {
                3
            }
            _ => return,
        };
        if specificity > self.specificity {
            *self = Ranked {
                specificity,
                quality,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(pairs: &[(&'static str, &'static str)]) -> Result<Requester, ToolError> {
        let mut headers = HeaderMap::new();
        for &(name, value) in pairs {
            headers.append(name, HeaderValue::from_static(value));
        }
        requester(&headers, Present::of(&headers))
    }

    const CHROMIUM: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,\
                            image/webp,image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7";
    const FIREFOX: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

    #[test]
    fn the_detection_table() {
        use Requester::{Agent, Human};
        let table: &[(&[(&str, &str)], Requester)] = &[
            (&[("accept", CHROMIUM)], Human),
            (&[("accept", FIREFOX)], Human),
            (&[("accept", "text/html")], Human),
            (
                &[("accept", "text/html;q=0.9, application/json;q=0.5")],
                Human,
            ),
            (&[], Agent),
            (&[("accept", "*/*")], Agent),
            (&[("accept", "application/json")], Agent),
            (&[("accept", "text/event-stream")], Agent),
            (&[("accept", "text/*")], Agent),
            (&[("accept", "text/html, application/json")], Agent),
            (&[("accept", "application/json, text/html;q=0.9")], Agent),
            (&[("accept", "text/html;q=0")], Agent),
            (&[("accept", "text/html;q=2")], Agent),
            (&[("accept", "text/html;q=abc, */*")], Agent),
            (&[("accept", CHROMIUM), ("carmy-channel", "agent")], Agent),
            (&[("accept", "*/*"), ("carmy-channel", "human")], Human),
            (&[("carmy-channel", " Human ")], Human),
            (
                &[("accept", "application/json"), ("carmy-channel", "AGENT")],
                Agent,
            ),
        ];
        for (headers, expected) in table {
            assert_eq!(of(headers).unwrap(), *expected, "{headers:?}");
        }
    }

    #[test]
    fn an_unknown_or_repeated_channel_is_refused() {
        for headers in [
            &[("carmy-channel", "robot")][..],
            &[("carmy-channel", "")],
            &[("carmy-channel", "human"), ("carmy-channel", "agent")],
        ] {
            let error = of(headers).unwrap_err();
            assert_eq!(error.code(), "INVALID_REQUEST", "{headers:?}");
        }
    }
}
