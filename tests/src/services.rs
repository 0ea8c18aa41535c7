//! The services some tests need, named by environment variables: a test without them is
//! skipped and says so, or fails where skipping is forbidden.

use std::io::Write as _;

/// The location of a service some tests need, from `var`: a server's URL, or a client program.
///
/// Unset, the test is skipped and says so on stderr, written directly: libtest hides what a
/// passing test prints with `eprintln!`. With `CARMY_REQUIRE_SERVICES` set, as `.ci/run` sets
/// it, the test fails instead, so CI never skips a test.
pub fn server_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CARMY_REQUIRE_SERVICES").is_some() => {
            panic!("{var} is not set, and CARMY_REQUIRE_SERVICES forbids skipping")
        }
        _ => {
            // libtest runs each test on a thread named after it.
            let thread = std::thread::current();
            let test = thread.name().unwrap_or("a test");
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: needs {var} (.ci/run sets it)"
            );
            None
        }
    }
}
