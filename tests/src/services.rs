//! The services some tests need, named by environment variables: a test without them is
//! skipped and says so, or fails where skipping is forbidden.

use std::io::Write as _;

/// The values of the variables a test needs (a server's URL, a client program), in the order
/// asked. Each entry is a variable's name, followed, where the test needs it for something
/// other than what it tests, by that purpose: `"CARMY_TEST_POSTGRES_URL (the effects ledger)"`.
///
/// With any of them unset, the test is skipped and says so in one line on stderr, naming every
/// one missing; written directly, as libtest hides what a passing test prints with
/// `eprintln!`. With `CARMY_REQUIRE_SERVICES` set, as `.ci/run` sets it, the test fails
/// instead, so CI never skips a test.
pub fn needs<const N: usize>(needs: [&str; N]) -> Option<[String; N]> {
    let mut missing = Vec::new();
    let values = needs.map(|need| {
        let var = need.split_once(' ').map_or(need, |(var, _)| var);
        match std::env::var(var) {
            Ok(value) if !value.is_empty() => value,
            _ => {
                missing.push(need);
                String::new()
            }
        }
    });
    if missing.is_empty() {
        return Some(values);
    }
    let named = listed(&missing);
    let one = missing.len() == 1;
    if std::env::var_os("CARMY_REQUIRE_SERVICES").is_some() {
        let verb = if one { "is" } else { "are" };
        panic!("{named} {verb} not set, and CARMY_REQUIRE_SERVICES forbids skipping");
    }
    // libtest runs each test on a thread named after it.
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    let them = if one { "it" } else { "them" };
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: needs {named}; .ci/run sets {them}"
    );
    None
}

/// The one variable a test needs: [`needs`] of one.
pub fn server_url(var: &str) -> Option<String> {
    needs([var]).map(|[value]| value)
}

/// `a`, `a and b`, `a, b and c`.
fn listed(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}
