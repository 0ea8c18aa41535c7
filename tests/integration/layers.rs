//! The runtime's modules stand in layers, each importing only the layers below it
//! (`docs/architecture.md`): no cycle between top-level modules of `carmy/src`, no module
//! outside the table, and no transport reaching into another.
//!
//! `cargo test -p carmy-tests --test integration layers -- --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every top-level module of `carmy/src` and its layer, lowest first. A new module fails the
/// test until it is placed here, deliberately.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "leaves",
        &[
            "wire",
            "status",
            "principal",
            "error",
            "tool_error",
            "state",
            "tls",
            "health",
            "reload",
        ],
    ),
    ("tool API", &["tool", "schema", "context", "auth"]),
    ("backends", &["store", "protection", "telemetry", "webhook"]),
    ("model", &["config", "catalog", "documents"]),
    ("engine", &["runtime", "executions", "events"]),
    ("snapshot", &["settings"]),
    ("HTTP", &["http"]),
    ("transports", &["api", "mcp", "serve"]),
    ("app", &["app", "testing", "lib"]),
];

/// Transports serve the engine side by side: none imports another.
const TRANSPORTS: &[&str] = &["api", "mcp", "serve"];

fn source_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../carmy/src")
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            files.push(path);
        }
    }
}

/// The file's text without comments, string and character literals: what remains are the
/// paths the code names.
fn code_of(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut code = String::with_capacity(text.len());
    let mut at = 0;
    while at < bytes.len() {
        let rest = &text[at..];
        if rest.starts_with("//") {
            at += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            // Block comments nest in Rust.
            let mut depth = 0;
            let mut index = 0;
            while index < rest.len() {
                if rest[index..].starts_with("/*") {
                    depth += 1;
                    index += 2;
                } else if rest[index..].starts_with("*/") {
                    depth -= 1;
                    index += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    index += rest[index..].chars().next().map_or(1, char::len_utf8);
                }
            }
            at += index;
        } else if let Some(length) = raw_string_length(rest) {
            at += length;
        } else if rest.starts_with('"') {
            let mut index = 1;
            while index < rest.len() {
                match rest.as_bytes()[index] {
                    b'\\' => index += 2,
                    b'"' => break,
                    _ => index += 1,
                }
            }
            at += index + 1;
        } else if let Some(length) = char_literal_length(rest) {
            at += length;
        } else {
            let next = rest.chars().next().unwrap();
            code.push(next);
            at += next.len_utf8();
        }
    }
    code
}

/// `r"…"`, `r#"…"#`, `br"…"`: the whole literal's length.
fn raw_string_length(rest: &str) -> Option<usize> {
    let start = rest.strip_prefix('b').unwrap_or(rest);
    let after_r = start.strip_prefix('r')?;
    let hashes = after_r.len() - after_r.trim_start_matches('#').len();
    let body = after_r[hashes..].strip_prefix('"')?;
    let closing = format!("\"{}", "#".repeat(hashes));
    let end = body.find(&closing)?;
    Some(rest.len() - body.len() + end + closing.len())
}

/// `'x'`, `'\n'`, `'\''`, `'\u{1b}'`: a character literal, not a lifetime.
fn char_literal_length(rest: &str) -> Option<usize> {
    let body = rest.strip_prefix('\'')?;
    let mut chars = body.char_indices();
    let (_, first) = chars.next()?;
    if first == '\\' {
        let close = body[1..].find('\'')?;
        return Some(close + 3);
    }
    let (index, second) = chars.next()?;
    (second == '\'').then_some(index + 2)
}

/// The module path of a file under `src`, e.g. `["http", "gate"]`.
fn module_path(root: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(root).unwrap();
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && !(parts.is_empty() && (stem == "lib" || stem == "main")) {
        parts.push(stem.to_owned());
    }
    if parts.is_empty() {
        parts.push("lib".to_owned());
    }
    parts
}

/// The top-level modules a file's code names through `crate::…` and `super::…`.
fn named_modules(code: &str, path: &[String]) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let bytes = code.as_bytes();
    let word_start =
        |at: usize| at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
    let identifier = |from: &str| -> String {
        from.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        if !word_start(at) {
            continue;
        }
        let rest = code[at + "crate::".len()..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a, b::c, d::{e, f}}`: the first segment of each entry.
            let mut depth = 0;
            let mut entry_start = true;
            for (index, character) in group.char_indices() {
                match character {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => entry_start = true,
                    c if entry_start && (c.is_ascii_alphabetic() || c == '_') && depth == 0 => {
                        named.insert(identifier(&group[index..]));
                        entry_start = false;
                    }
                    c if !c.is_whitespace() => entry_start = false,
                    _ => {}
                }
            }
        } else {
            let name = identifier(rest);
            if !name.is_empty() {
                named.insert(name);
            }
        }
    }
    // `super::` climbs from the file's module (a `mod.rs` is its folder's module).
    for (at, _) in code.match_indices("super::") {
        if !word_start(at) || (at >= 7 && &code[at - 7..at] == "super::") {
            continue;
        }
        let mut climbs = 0;
        let mut rest = &code[at..];
        while let Some(after) = rest.strip_prefix("super::") {
            climbs += 1;
            rest = after;
        }
        if climbs >= path.len() {
            let name = identifier(rest);
            if !name.is_empty() {
                named.insert(name);
            }
        }
    }
    named
}

/// Edges between top-level modules: who names whom.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = source_root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let tops: BTreeSet<String> = files
        .iter()
        .map(|file| module_path(&root, file)[0].clone())
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let path = module_path(&root, file);
        let text = std::fs::read_to_string(file).unwrap();
        let edges = graph.entry(path[0].clone()).or_default();
        for name in named_modules(&code_of(&text), &path) {
            if name != path[0] && tops.contains(&name) {
                edges.insert(name);
            }
        }
    }
    graph
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

/// The modules on a cycle, if there is one.
fn a_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_owned(), 1);
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let from = stack.iter().position(|entry| entry == next).unwrap();
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(cycle) = visit(next, graph, state, stack) {
                        return Some(cycle);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node) {
            let mut stack = Vec::new();
            if let Some(cycle) = visit(node, graph, &mut state, &mut stack) {
                return Some(cycle);
            }
        }
    }
    None
}

#[test]
fn modules_import_only_downward_and_never_in_a_cycle() {
    let graph = module_graph();
    for (layer, modules) in LAYERS.iter().rev() {
        println!("{layer}:");
        for module in *modules {
            let imports: Vec<&str> = graph
                .get(*module)
                .into_iter()
                .flatten()
                .map(String::as_str)
                .collect();
            println!("  {module} -> {}", imports.join(", "));
        }
    }
    let unplaced: Vec<&String> = graph
        .keys()
        .filter(|module| layer_of(module).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules with no layer in LAYERS: {unplaced:?}"
    );
    let mut upward = Vec::new();
    for (module, imports) in &graph {
        for imported in imports {
            if layer_of(imported) > layer_of(module) {
                upward.push(format!("{module} -> {imported}"));
            }
            if TRANSPORTS.contains(&module.as_str()) && TRANSPORTS.contains(&imported.as_str()) {
                upward.push(format!(
                    "{module} -> {imported} (one transport into another)"
                ));
            }
        }
    }
    assert!(upward.is_empty(), "imports against the layers: {upward:#?}");
    assert_eq!(a_cycle(&graph), None, "a cycle between top-level modules");
}

#[test]
fn the_reader_sees_code_not_comments_or_strings() {
    let code = code_of(
        "use crate::a; // crate::b\n/* crate::c /* nested crate::d */ */ let s = \"crate::e\";\n\
         let r = r#\"crate::f\"#; let c = '\"'; use crate::{g, h::{i, j}, k};\n",
    );
    let named = named_modules(&code, &["x".to_owned()]);
    let names: Vec<&str> = named.iter().map(String::as_str).collect();
    assert_eq!(names, ["a", "g", "h", "k"]);
    let nested = named_modules(
        "use super::super::y::z; use super::w;",
        &["x".to_owned(), "inner".to_owned()],
    );
    assert_eq!(nested.into_iter().collect::<Vec<_>>(), ["y"]);
    let mut graph = BTreeMap::new();
    graph.insert("p".to_owned(), BTreeSet::from(["q".to_owned()]));
    graph.insert("q".to_owned(), BTreeSet::from(["p".to_owned()]));
    assert_eq!(
        a_cycle(&graph),
        Some(vec!["p".to_owned(), "q".to_owned(), "p".to_owned()])
    );
}
