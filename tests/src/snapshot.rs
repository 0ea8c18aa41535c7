//! Snapshots: documents the tests compare, byte for byte, with files under `tests/snapshots`.

use std::path::Path;

/// Compares `text` with the snapshot file at `path`. With `CARMY_BLESS` set, after an intended
/// change, writes the file first; never where `CI` is set, where a snapshot must fail the run
/// rather than rewrite itself to pass.
pub fn assert_snapshot(path: &Path, text: &str) {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |name| name.to_string_lossy().into_owned(),
    );
    if std::env::var_os("CARMY_BLESS").is_some() {
        assert!(
            std::env::var_os("CI").is_none_or(|ci| ci.is_empty()),
            "CARMY_BLESS would rewrite {name}, and CI is set: snapshots are blessed outside CI"
        );
        std::fs::write(path, text)
            .unwrap_or_else(|error| panic!("{name} cannot be written: {error}"));
    }
    let expected = std::fs::read_to_string(path)
        .unwrap_or_else(|error| panic!("{name} cannot be read ({error}); CARMY_BLESS=1 writes it"));
    assert_eq!(
        text, expected,
        "{name} changed; rerun with CARMY_BLESS=1 if intended"
    );
}
