//! The direction of dependencies between the agent's top-level modules (ARCHITECTURE.md,
//! the agent's layers and "Invariants"): no module imports another that imports it back, and the
//! leaves stay leaves.
//!
//! The graph comes from the source: every `crate::<module>` path (also inside
//! `crate::{…}` groups, and through the crate root's `pub use` re-exports, so
//! `crate::Agent` counts as `agent`) in `src/**/*.rs`. Left out: comments (doc links are
//! navigation, not dependencies) and test code — `tests.rs`, `*_tests.rs`, files under a
//! `tests/` folder of a module, and an inline
//! `#[cfg(test)] mod … {` to the end of its file — which may reach into the composition
//! root (`state`) to build fixtures.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The source without comments (line comments to the end of the line, block comments).
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(i) = rest.find('/') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("//") {
            rest = tail.find('\n').map_or("", |n| &tail[n..]);
        } else if tail.starts_with("/*") {
            rest = tail.find("*/").map_or("", |n| &tail[n + 2..]);
        } else {
            out.push('/');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// The source up to an inline `#[cfg(test)] mod name {`, if it has one.
fn without_inline_tests(src: &str) -> &str {
    let mut from = 0;
    while let Some(i) = src[from..].find("#[cfg(test)]") {
        let at = from + i;
        let after = src[at + "#[cfg(test)]".len()..].trim_start();
        if let Some(m) = after.strip_prefix("mod ") {
            let name_end = m.find(|c: char| !is_ident(c)).unwrap_or(m.len());
            if m[name_end..].trim_start().starts_with('{') {
                return &src[..at];
            }
        }
        from = at + 1;
    }
    src
}

/// Every name `src` reaches through `crate::`: the first segment of each path, and each
/// first segment inside a `crate::{…}` group.
fn crate_paths(src: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find("crate::") {
        let preceded_by_ident = rest[..i].chars().next_back().is_some_and(is_ident);
        rest = &rest[i + "crate::".len()..];
        if preceded_by_ident {
            continue; // another crate's path, such as `levee_crate::`
        }
        if let Some(group) = rest.strip_prefix('{') {
            // The top level of the group: names after `{` or `,` (nested groups skipped).
            let mut depth = 0;
            let mut at_item_start = true;
            let mut word = String::new();
            for c in group.chars() {
                if is_ident(c) && depth == 0 && at_item_start {
                    word.push(c);
                    continue;
                }
                if !word.is_empty() {
                    names.push(std::mem::take(&mut word));
                    at_item_start = false;
                }
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => at_item_start = true,
                    _ => {}
                }
            }
            if !word.is_empty() {
                names.push(word);
            }
        } else {
            let end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
            names.push(rest[..end].to_string());
        }
    }
    names
}

/// The top-level modules declared in `lib.rs`, and what each root-level `pub use` name
/// re-exports from.
fn crate_root() -> (BTreeSet<String>, BTreeMap<String, String>) {
    let lib = strip_comments(&std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs"));
    let mut modules = BTreeSet::new();
    let mut reexports = BTreeMap::new();
    let mut statements = lib.split(';');
    for statement in statements.by_ref() {
        let s = statement.trim();
        // Attributes (`#[cfg(...)]`) may precede the item.
        let item = s.rsplit(']').next().unwrap_or(s).trim();
        let item = item.strip_prefix("pub ").unwrap_or(item).trim();
        if let Some(name) = item.strip_prefix("mod ") {
            let name = name.trim();
            if name.chars().all(is_ident) {
                modules.insert(name.to_string());
            }
        } else if let Some(path) = item.strip_prefix("use ") {
            let path: String = path.chars().filter(|c| !c.is_whitespace()).collect();
            if let Some((module, names)) = path.split_once("::") {
                let names = names.trim_start_matches('{').trim_end_matches('}');
                for name in names.split(',').filter(|n| !n.is_empty()) {
                    reexports.insert(name.to_string(), module.to_string());
                }
            }
        }
    }
    (modules, reexports)
}

/// module → module it imports → files that do.
fn module_graph() -> Graph {
    let (modules, reexports) = crate_root();
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut graph = Graph::new();
    for file in files {
        let rel = file.strip_prefix(src()).unwrap().to_string_lossy().replace('\\', "/");
        let name = file.file_name().unwrap().to_string_lossy();
        if rel == "lib.rs" || name == "tests.rs" || name.ends_with("_tests.rs") || rel.contains("/tests/") {
            continue;
        }
        let from = rel.split('/').next().unwrap().trim_end_matches(".rs").to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        let code = strip_comments(without_inline_tests(&text));
        for name in crate_paths(&code) {
            let to = reexports.get(&name).cloned().unwrap_or(name);
            if modules.contains(&to) && to != from {
                graph.entry(from.clone()).or_default().entry(to).or_default().insert(rel.clone());
            }
        }
    }
    graph
}

/// A cycle through `start`, as the list of modules on it, if there is one.
fn cycle_from(graph: &Graph, start: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &Graph,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(at).into_iter().flat_map(|m| m.keys()) {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, start, next, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    walk(graph, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn agent_modules_import_each_other_in_one_direction_only() {
    let graph = module_graph();
    // The scan sees the dependencies that are known to exist (it cannot pass vacuously).
    for (from, to) in [("enforce", "retry"), ("state", "enforce"), ("inbound", "agent"), ("retry", "failure")]
    {
        assert!(graph.get(from).is_some_and(|m| m.contains_key(to)), "{from} -> {to} not found in {graph:?}");
    }
    let mut cycles = Vec::new();
    for module in graph.keys() {
        if let Some(cycle) = cycle_from(&graph, module) {
            let files: Vec<String> = cycle
                .windows(2)
                .map(|w| format!("{} -> {}: {:?}", w[0], w[1], graph[&w[0]][&w[1]]))
                .collect();
            cycles.push(format!("{}\n    {}", cycle.join(" -> "), files.join("\n    ")));
        }
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_leaves_import_nothing_above_them() {
    let graph = module_graph();
    let imports =
        |m: &str| -> Vec<String> { graph.get(m).map(|t| t.keys().cloned().collect()).unwrap_or_default() };
    assert_eq!(imports("failure"), Vec::<String>::new(), "failure imports nothing from the crate");
    assert_eq!(imports("applied"), ["policy"], "applied imports only the policy model");
    assert_eq!(
        imports("policy"),
        Vec::<String>::new(),
        "the policy model (shared with the server) is a leaf"
    );
    for registry in ["registry", "flags"] {
        for m in imports(registry) {
            assert!(["applied", "policy", "metrics_names"].contains(&m.as_str()), "{registry} imports {m}");
        }
    }
}

#[test]
fn the_scanner_reads_groups_re_exports_and_skips_tests_and_comments() {
    let code =
        "use crate::{a::X, b, c::{d, e}};\nlet x = crate::f::g(); // crate::h\n/* crate::i */ other_crate::j";
    assert_eq!(crate_paths(&strip_comments(code)), ["a", "b", "c", "f"]);
    let with_tests = "use crate::k;\n#[cfg(test)]\nmod tests {\n    use crate::l;\n}\n";
    assert_eq!(crate_paths(without_inline_tests(with_tests)), ["k"]);
    let (modules, reexports) = crate_root();
    assert!(modules.contains("enforce") && modules.contains("applied"));
    assert_eq!(reexports.get("Agent").map(String::as_str), Some("agent"));
}
