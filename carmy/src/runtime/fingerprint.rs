//! Fingerprints of calls: the tool and its arguments in canonical form (object keys sorted),
//! hashed so a retry with reordered keys is the same call.

use std::io::{self, Write};
use std::sync::Arc;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::store::Fingerprint;

pub(crate) fn fingerprint(tool: &Arc<str>, arguments: &Value) -> Fingerprint {
    let mut hasher = Sha256::new();
    hasher.update(tool.as_bytes());
    hasher.update([0]);
    write_canonical(&mut HashWriter(&mut hasher), arguments).expect("hashing never fails to write");
    Fingerprint {
        tool: Arc::clone(tool),
        digest: hasher.finalize().into(),
    }
}

/// Writes `value` as JSON with object keys in sorted order, whatever the map's own order.
fn write_canonical(out: &mut impl Write, value: &Value) -> io::Result<()> {
    match value {
        // Keys already in order (a one-key object, say) are written without sorting a copy.
        Value::Object(map) if map.keys().is_sorted() => write_object(out, map.iter()),
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            write_object(out, entries.into_iter())
        }
        Value::Array(items) => {
            out.write_all(b"[")?;
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.write_all(b",")?;
                }
                write_canonical(out, item)?;
            }
            out.write_all(b"]")
        }
        scalar => serde_json::to_writer(out, scalar).map_err(io::Error::other),
    }
}

fn write_object<'v>(
    out: &mut impl Write,
    entries: impl Iterator<Item = (&'v String, &'v Value)>,
) -> io::Result<()> {
    out.write_all(b"{")?;
    for (index, (key, value)) in entries.enumerate() {
        if index > 0 {
            out.write_all(b",")?;
        }
        serde_json::to_writer(&mut *out, key)?;
        out.write_all(b":")?;
        write_canonical(out, value)?;
    }
    out.write_all(b"}")
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fingerprint(tool: &str, arguments: &Value) -> Fingerprint {
        super::fingerprint(&Arc::from(tool), arguments)
    }

    #[test]
    fn key_order_does_not_matter_but_values_do() {
        let a = fingerprint("t", &json!({ "a": 1, "b": { "x": [1, 2], "y": null } }));
        let b = fingerprint("t", &json!({ "b": { "y": null, "x": [1, 2] }, "a": 1 }));
        assert_eq!(a, b);
        assert_ne!(
            a,
            fingerprint("t", &json!({ "a": 2, "b": { "x": [1, 2], "y": null } }))
        );
        assert_ne!(
            a,
            fingerprint("u", &json!({ "a": 1, "b": { "x": [1, 2], "y": null } }))
        );
        assert_ne!(
            fingerprint("t", &json!({ "x": [1, 2] })),
            fingerprint("t", &json!({ "x": [2, 1] }))
        );
    }

    /// The canonical text is what durable stores' fingerprints were computed from: it must
    /// not change, whether or not the keys came in order.
    #[test]
    fn canonical_text_sorts_keys_at_every_depth() {
        let canonical = |value: &Value| {
            let mut text = Vec::new();
            write_canonical(&mut text, value).unwrap();
            String::from_utf8(text).unwrap()
        };
        let expected = r#"{"a":[{"c":"\"","d":2.5}],"b":{"y":null,"z":true}}"#;
        assert_eq!(
            canonical(&json!({ "a": [{ "c": "\"", "d": 2.5 }], "b": { "y": null, "z": true } })),
            expected
        );
        assert_eq!(
            canonical(&json!({ "b": { "z": true, "y": null }, "a": [{ "d": 2.5, "c": "\"" }] })),
            expected
        );
    }
}
