//! The `CARMY_*` variables that override the file's scalar keys.

use std::num::{NonZeroU32, NonZeroU64};

pub(super) fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `rate_limit.known` is overridden by `CARMY_RATE_LIMIT_KNOWN`.
pub(super) fn env_name(key: &str) -> String {
    format!("CARMY_{}", key.replace('.', "_").to_ascii_uppercase())
}

pub(super) fn set<T: FromEnv>(slot: &mut T, value: &str) -> Result<(), &'static str> {
    *slot = T::from_env(value.trim())?;
    Ok(())
}

/// A value read from a `CARMY_*` variable.
pub(super) trait FromEnv: Sized {
    /// The value, or what it must be.
    fn from_env(text: &str) -> Result<Self, &'static str>;
}

macro_rules! from_env_by_parse {
    ($($ty:ty => $expected:literal),* $(,)?) => {
        $(
            impl FromEnv for $ty {
                fn from_env(text: &str) -> Result<Self, &'static str> {
                    text.parse().map_err(|_| $expected)
                }
            }
        )*
    };
}

from_env_by_parse! {
    bool => "`true` or `false`",
    NonZeroU32 => "a number from 1",
    NonZeroU64 => "a number from 1",
    u64 => "a whole number",
}

impl<T: FromEnv> FromEnv for Option<T> {
    fn from_env(text: &str) -> Result<Self, &'static str> {
        T::from_env(text).map(Some)
    }
}

impl FromEnv for Vec<String> {
    fn from_env(text: &str) -> Result<Self, &'static str> {
        Ok(text
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(str::to_owned)
            .collect())
    }
}
