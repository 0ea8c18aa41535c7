//! The `Accept` header, read the same way by every negotiation: event streams, OpenMetrics,
//! and whether a person is asking.

use axum::http::HeaderMap;
use axum::http::header::ACCEPT;

/// Each media range of every `Accept` with its quality, in order: `("text/html", 1.0)`. A
/// range whose `q` is not a number from 0 to 1 is left out.
pub(crate) fn media_ranges(headers: &HeaderMap) -> impl Iterator<Item = (&str, f32)> {
    headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|range| {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or_default().trim();
            let quality = parts
                .filter_map(|parameter| parameter.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
                .map_or(Some(1.0), |(_, value)| value.trim().parse::<f32>().ok())
                .filter(|quality| (0.0..=1.0).contains(quality))?;
            Some((media, quality))
        })
}
