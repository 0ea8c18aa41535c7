//! Which of the request headers carmy reads a request carries, found in one pass over its
//! headers: most requests carry few of them, and a lookup by name of one that is absent still
//! hashes the name and probes the map, a dozen times a request.

use axum::http::{Extensions, HeaderMap};

use super::Admitted;

/// A request header that carmy reads, in the routes or at the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Header {
    Accept,
    Authorization,
    CarmyChannel,
    CarmyVersion,
    IdempotencyKey,
    Origin,
    Prefer,
    Traceparent,
}

impl Header {
    /// The header `name` is, if carmy reads it (names in a `HeaderMap` are lowercase).
    fn named(name: &str) -> Option<Header> {
        Some(match name {
            "accept" => Header::Accept,
            "authorization" => Header::Authorization,
            "carmy-channel" => Header::CarmyChannel,
            "carmy-version" => Header::CarmyVersion,
            "idempotency-key" => Header::IdempotencyKey,
            "origin" => Header::Origin,
            "prefer" => Header::Prefer,
            "traceparent" => Header::Traceparent,
            _ => return None,
        })
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// The [`Header`] headers a request carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Present(u8);

impl Present {
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        Present(
            headers
                .keys()
                .filter_map(|name| Header::named(name.as_str()))
                .fold(0, |present, known| present | known.bit()),
        )
    }

    /// What the gate found in an admitted request, else what `headers` carry.
    pub(crate) fn in_request(extensions: &Extensions, headers: &HeaderMap) -> Self {
        match extensions.get::<Admitted>() {
            Some(admitted) => admitted.present,
            None => Present::of(headers),
        }
    }

    pub(crate) fn has(self, known: Header) -> bool {
        self.0 & known.bit() != 0
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use axum::http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, ORIGIN};

    use super::*;
    use crate::wire::{CARMY_CHANNEL, CARMY_VERSION, IDEMPOTENCY_KEY, PREFER};

    const ALL: [Header; 8] = [
        Header::Accept,
        Header::Authorization,
        Header::CarmyChannel,
        Header::CarmyVersion,
        Header::IdempotencyKey,
        Header::Origin,
        Header::Prefer,
        Header::Traceparent,
    ];

    #[test]
    fn each_known_header_is_found_by_its_name_and_no_other() {
        let names = [
            ACCEPT.clone(),
            AUTHORIZATION.clone(),
            CARMY_CHANNEL.clone(),
            CARMY_VERSION.clone(),
            IDEMPOTENCY_KEY.clone(),
            ORIGIN.clone(),
            PREFER.clone(),
            axum::http::HeaderName::from_static("traceparent"),
        ];
        for (known, name) in ALL.into_iter().zip(names) {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            headers.insert(name.clone(), HeaderValue::from_static("x"));
            let present = Present::of(&headers);
            for other in ALL {
                assert_eq!(present.has(other), other == known, "{name} as {other:?}");
            }
        }
    }

    #[test]
    fn names_are_matched_whatever_their_case_and_values_repeated() {
        let mut headers = HeaderMap::new();
        // A header map keeps names lowercase, however they were sent.
        for (name, value) in [
            ("Prefer", "respond-async"),
            ("PREFER", "wait=5"),
            ("X-Prefer", "no"),
        ] {
            let name = axum::http::HeaderName::from_bytes(name.as_bytes()).expect("a valid name");
            headers.append(name, HeaderValue::from_static(value));
        }
        let present = Present::of(&headers);
        assert!(present.has(Header::Prefer));
        assert_eq!(present, Present(Header::Prefer.bit()));
        assert_eq!(Present::of(&HeaderMap::new()), Present::default());
    }
}
