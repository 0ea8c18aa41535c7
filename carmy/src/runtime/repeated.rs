//! Rate-limited logging of an error that repeats: a store outage fails every call, and must not
//! write a line per call.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// At most one line per site and window; the next logged line says how many were held back.
pub(crate) const LOG_WINDOW: Duration = Duration::from_secs(10);

/// One log site's limiter.
#[derive(Debug, Default)]
pub(crate) struct Repeated {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// When the last line was logged.
    logged: Option<Instant>,
    /// Occurrences held back since.
    held_back: u64,
}

impl Repeated {
    /// `Some(held_back)` when this occurrence should be logged, with how many occurrences were
    /// held back since the last line; `None` to hold it back.
    pub(crate) fn admit(&self) -> Option<u64> {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match state.logged {
            Some(logged) if now.duration_since(logged) < LOG_WINDOW => {
                state.held_back += 1;
                None
            }
            _ => {
                state.logged = Some(now);
                Some(std::mem::take(&mut state.held_back))
            }
        }
    }
}

/// The suffix of a logged line that stands for `held_back` others.
pub(crate) fn summary(held_back: u64) -> String {
    if held_back == 0 {
        String::new()
    } else {
        format!(" (repeated {held_back} times since the last report)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_per_window_then_a_summary() {
        let repeated = Repeated::default();
        assert_eq!(repeated.admit(), Some(0));
        for _ in 0..1_000 {
            assert_eq!(repeated.admit(), None);
        }
        tokio::time::advance(LOG_WINDOW).await;
        assert_eq!(repeated.admit(), Some(1_000));
        assert_eq!(repeated.admit(), None);
        assert_eq!(summary(0), "");
        assert_eq!(summary(3), " (repeated 3 times since the last report)");
    }
}
