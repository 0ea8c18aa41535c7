//! Reading the configuration file without trusting its size, and errors fit to be shown.

use std::path::Path;

use crate::error::Error;

/// The most a configuration file may hold, in bytes (1 MiB): a `carmy.toml` is a few
/// kilobytes, and reading a larger one (or a device behind a symlink) would only fill memory.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// The text of the file at `path`: a regular file of at most [`MAX_FILE_BYTES`], never read
/// past that.
pub(super) fn read_bounded(path: &Path) -> Result<String, Error> {
    use std::io::Read as _;
    let refused = |why: &dyn std::fmt::Display| {
        Error::Config(clip_error(&format!(
            "cannot read {}: {why}",
            path.display()
        )))
    };
    let too_large = || {
        refused(&format_args!(
            "it is larger than {MAX_FILE_BYTES} bytes, the most a configuration file may be"
        ))
    };
    // Looked at before opening (which follows symlinks too): opening a FIFO would wait for a
    // writer, and a device has no end.
    let metadata = std::fs::metadata(path).map_err(|error| refused(&error))?;
    if !metadata.is_file() {
        return Err(refused(&"it is not a regular file"));
    }
    if metadata.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let file = std::fs::File::open(path).map_err(|error| refused(&error))?;
    // What was opened may not be what was looked at: the path can be replaced in between.
    let opened = file.metadata().map_err(|error| refused(&error))?;
    if !opened.is_file() {
        return Err(refused(&"it is not a regular file"));
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| refused(&error))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    String::from_utf8(bytes).map_err(|_| refused(&"it is not UTF-8 text"))
}

/// How many lines of a configuration error are kept: TOML's are five (the message, the line at
/// fault, its caret).
const MAX_ERROR_LINES: usize = 12;

/// A configuration error as it is shown: each line cut to [`MAX_ECHO`](crate::tool_error::MAX_ECHO)
/// bytes, at most [`MAX_ERROR_LINES`] lines (a few KiB in all). TOML quotes the whole line at
/// fault, and a file may be a single line of a megabyte.
fn clip_error(message: &str) -> String {
    let mut lines = message.lines();
    let mut clipped = String::new();
    for (index, line) in lines.by_ref().take(MAX_ERROR_LINES).enumerate() {
        if index > 0 {
            clipped.push('\n');
        }
        clipped.push_str(&crate::tool_error::clip(line));
    }
    if lines.next().is_some() {
        clipped.push_str("\n…");
    }
    clipped
}

/// `error` with its configuration message clipped ([`clip_error`]).
pub(crate) fn clipped(error: Error) -> Error {
    match error {
        Error::Config(message) => Error::Config(clip_error(&message)),
        other => other,
    }
}
