//! Compile-fail and compile-pass tests of `#[carmy::tool]`; see `tests/`.
