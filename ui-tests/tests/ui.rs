//! Every misuse of `#[carmy::tool]` is a compile error at the tokens at fault; every accepted
//! signature compiles. The expected `.stderr` is pinned to this machine's stable toolchain.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/fail/*.rs");
    cases.pass("tests/pass/*.rs");
}
