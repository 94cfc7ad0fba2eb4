//! The shape of the server crate, checked on its source: which top-level module may use
//! which (a table, acyclic), and which modules know nothing about HTTP. ARCHITECTURE.md
//! draws the same directions and states them as "knows nothing about" invariants.
//!
//! A module's dependencies are the `crate::<module>` paths (also inside `use` groups,
//! attributes and macros) and `super::` paths that climb to the crate root, read from
//! Rust's tokens, so comments and strings do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};

/// Every top-level module of `server/src` and the modules it may use. A new module needs
/// an entry here and its invariants in ARCHITECTURE.md.
const ALLOWED: &[(&str, &[&str])] = &[
    ("db", &[]),
    ("diff", &[]),
    ("manifest", &[]),
    ("import", &["manifest"]),
    ("fuzz", &["import", "manifest"]),
    // cli: an HTTP client of the API; it reads the API's state words as db's enums (the
    // word the API answers is the stored one).
    ("cli", &["db", "manifest"]),
    ("shutdown", &[]),
    // runtime: the sync runtime and where the sync side's database reads run; knows no
    // other module.
    ("runtime", &[]),
    ("hub", &["db"]),
    // rollout: the rules of staged rollouts (cohort, what an instance is served, halting).
    ("rollout", &["db", "health"]),
    ("advice", &["db"]),
    // The alert_after watcher: advice's rule over the store, a task stopped like the others.
    ("alerts", &["actions", "advice", "db", "shutdown"]),
    // login_limit: the login limiter, which knows nothing of passwords, tokens or storage.
    ("login_limit", &[]),
    ("auth", &["db", "login_limit"]),
    ("fleet", &["db"]),
    // health: agents' windowed counts, bounded by agent_text, kept in memory and in db.
    ("health", &["agent_text", "db", "shutdown"]),
    ("actions", &["advice", "auth", "db", "hub", "rollout"]),
    // sweeper: a rollout it halts goes to the alert webhook.
    ("sweeper", &["actions", "alerts", "db", "health", "rollout", "shutdown"]),
    ("listener", &["db", "hub", "shutdown"]),
    ("agent_text", &[]),
    // experiments: their rules (pure), their readings from the agents' health, their run
    // (every change an action) and the watchdog, a task stopped like the others.
    ("experiments", &["actions", "db", "health", "shutdown"]),
    ("tls", &["shutdown"]),
    // streams: what a new stream of sync and xds passes (stopping, token, scope), told once.
    ("streams", &["auth", "db", "runtime", "shutdown"]),
    (
        "sync",
        &["agent_text", "auth", "db", "fleet", "health", "hub", "rollout", "runtime", "shutdown", "streams"],
    ),
    // xds: the outbound policy over Envoy's ADS, pushed as the hub publishes, to the
    // instance's revision during a rollout.
    ("xds", &["agent_text", "auth", "db", "hub", "rollout", "runtime", "shutdown", "streams"]),
    // config: the defaults of the settings it loads (stream limits, the agent lease, TLS
    // files, the endpoints xDS serves, how often the sweeper drives rollouts).
    ("config", &["fleet", "runtime", "sweeper", "sync", "tls", "xds"]),
    // web, api, ui: the stop flag ends long-lived responses (live events, long polls).
    ("web", &["actions", "auth", "db", "experiments", "health", "hub", "shutdown"]),
    (
        "api",
        &[
            "actions",
            "advice",
            "auth",
            "db",
            "diff",
            "experiments",
            "health",
            "manifest",
            "rollout",
            "shutdown",
            "web",
        ],
    ),
    // ui reads `diff` for the policy editor's preview, the revision history and the diff a
    // change request's reviewer approves; `experiments` for an experiment's spec and report;
    // `health` for the agents' recent health on the service page and in its alarms.
    (
        "ui",
        &["actions", "advice", "auth", "db", "diff", "experiments", "health", "rollout", "shutdown", "web"],
    ),
    // The sidecar: an agent of the agent crate, the OFREP router the API serves too, and
    // its defaults read from a manifest.
    ("sidecar", &["api", "manifest"]),
    (
        "app",
        &[
            "actions",
            "alerts",
            "api",
            "auth",
            "config",
            "db",
            "experiments",
            "fleet",
            "health",
            "hub",
            "listener",
            "runtime",
            "shutdown",
            "sweeper",
            "sync",
            "tls",
            "ui",
            "web",
            "xds",
        ],
    ),
];

/// Modules that know nothing about HTTP: the domain, storage and what runs beside them.
const HTTP_FREE: &[&str] = &[
    "actions",
    "advice",
    "agent_text",
    "auth",
    "db",
    "diff",
    "experiments",
    "fleet",
    "health",
    "hub",
    "listener",
    "login_limit",
    "manifest",
    "rollout",
    "runtime",
    "shutdown",
    "sweeper",
];

/// Names that only HTTP code uses.
const HTTP_NAMES: &[&str] = &[
    "axum",
    "http",
    "http_body_util",
    "hyper",
    "tower_http",
    "ApiError",
    "UiError",
    "StatusCode",
    "IntoResponse",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file: `api/services.rs` → `[api, services]`, `api/mod.rs` → `[api]`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// One parsed file of the crate.
struct File {
    path: PathBuf,
    module: Vec<String>,
    tokens: TokenStream,
}

/// Every file of the library, except the crate root (lib.rs) and the binary (main.rs).
fn library() -> Vec<File> {
    let mut paths = Vec::new();
    rust_files(&src(), &mut paths);
    paths.sort();
    paths
        .into_iter()
        .filter_map(|path| {
            let rel = path.strip_prefix(src()).unwrap().to_path_buf();
            if rel == Path::new("lib.rs") || rel == Path::new("main.rs") {
                return None;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let tokens: TokenStream =
                text.parse().unwrap_or_else(|e| panic!("{} does not lex: {e:?}", path.display()));
            Some(File { module: module_path(&rel), path: rel, tokens })
        })
        .collect()
}

fn is_path_sep(tts: &[TokenTree], i: usize) -> bool {
    matches!((tts.get(i), tts.get(i + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
            if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
}

fn ident_at(tts: &[TokenTree], i: usize) -> Option<String> {
    match tts.get(i) {
        Some(TokenTree::Ident(id)) => Some(id.to_string()),
        _ => None,
    }
}

/// The first segment of each path that starts at index `i` of a crate-root path: one
/// identifier, or each tree of a `{…}` group.
fn root_segments(tts: &[TokenTree], i: usize, out: &mut BTreeSet<String>) {
    match tts.get(i) {
        Some(TokenTree::Ident(id)) => {
            out.insert(id.to_string());
        }
        Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace => {
            let inner: Vec<TokenTree> = g.stream().into_iter().collect();
            let mut start = true;
            for tt in &inner {
                if start && let TokenTree::Ident(id) = tt {
                    out.insert(id.to_string());
                }
                start = matches!(tt, TokenTree::Punct(p) if p.as_char() == ',');
            }
        }
        _ => {}
    }
}

/// Collects the crate-root items that `tokens` (inside module `module`) refer to.
fn crate_refs(tokens: TokenStream, module: &[String], out: &mut BTreeSet<String>) {
    let tts: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < tts.len() {
        match &tts[i] {
            TokenTree::Ident(id) if id == "mod" => {
                if let (Some(name), Some(TokenTree::Group(g))) = (ident_at(&tts, i + 1), tts.get(i + 2))
                    && g.delimiter() == Delimiter::Brace
                {
                    let mut inner = module.to_vec();
                    inner.push(name);
                    crate_refs(g.stream(), &inner, out);
                    i += 3;
                    continue;
                }
            }
            TokenTree::Ident(id) if id == "crate" && is_path_sep(&tts, i + 1) => {
                root_segments(&tts, i + 3, out);
            }
            TokenTree::Ident(id) if id == "super" && (i == 0 || !is_path_sep(&tts, i.saturating_sub(2))) => {
                let mut ups = 1;
                let mut j = i + 1;
                while is_path_sep(&tts, j) && ident_at(&tts, j + 2).as_deref() == Some("super") {
                    ups += 1;
                    j += 3;
                }
                if ups == module.len() && is_path_sep(&tts, j) {
                    root_segments(&tts, j + 2, out);
                }
            }
            TokenTree::Group(g) => crate_refs(g.stream(), module, out),
            _ => {}
        }
        i += 1;
    }
}

fn idents(tokens: TokenStream, out: &mut BTreeSet<String>) {
    for tt in tokens {
        match tt {
            TokenTree::Ident(id) => {
                out.insert(id.to_string());
            }
            TokenTree::Group(g) => idents(g.stream(), out),
            _ => {}
        }
    }
}

/// The top-level modules each top-level module uses, with the files that use them.
fn graph() -> BTreeMap<String, BTreeMap<String, BTreeSet<PathBuf>>> {
    let files = library();
    let modules: BTreeSet<String> = files.iter().map(|f| f.module[0].clone()).collect();
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<PathBuf>>> = BTreeMap::new();
    for f in files {
        let top = f.module[0].clone();
        let mut refs = BTreeSet::new();
        crate_refs(f.tokens, &f.module, &mut refs);
        let deps = graph.entry(top.clone()).or_default();
        for r in refs {
            assert!(
                modules.contains(&r),
                "{} names crate::{r}, which is not a module: name the module it lives in",
                f.path.display()
            );
            if r != top {
                deps.entry(r).or_default().insert(f.path.clone());
            }
        }
    }
    graph
}

/// A cycle of `graph`, if it has one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(pos) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[pos..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_top_level_module_imports_one_that_imports_it_back() {
    let graph: BTreeMap<String, BTreeSet<String>> =
        graph().into_iter().map(|(m, deps)| (m, deps.into_keys().collect())).collect();
    if let Some(cycle) = find_cycle(&graph) {
        panic!("the modules of levee-server form a cycle: {}\ngraph: {graph:#?}", cycle.join(" → "));
    }
    let allowed: BTreeMap<String, BTreeSet<String>> = ALLOWED
        .iter()
        .map(|(m, deps)| (m.to_string(), deps.iter().map(|d| d.to_string()).collect()))
        .collect();
    assert_eq!(find_cycle(&allowed), None, "the table of allowed directions has a cycle");
}

#[test]
fn every_module_uses_only_what_its_layer_allows() {
    let graph = graph();
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut wrong = Vec::new();
    for (module, deps) in &graph {
        let Some(may) = allowed.get(module.as_str()) else {
            wrong.push(format!(
                "{module} is not in ALLOWED: add it with the modules it may use, and to ARCHITECTURE.md"
            ));
            continue;
        };
        for (dep, files) in deps {
            if !may.contains(&dep.as_str()) {
                wrong.push(format!("{module} must not use {dep} (in {files:?})"));
            }
        }
    }
    for (module, _) in ALLOWED {
        if !graph.contains_key(*module) {
            wrong.push(format!("ALLOWED lists {module}, which is not a module of server/src any more"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn ui_and_api_never_depend_on_each_other() {
    let graph = graph();
    for (a, b) in [("ui", "api"), ("api", "ui")] {
        assert!(!graph[a].contains_key(b), "{a} uses {b} in {:?}; share through web or actions", graph[a][b]);
    }
}

#[test]
fn the_domain_and_storage_know_nothing_about_http() {
    let mut wrong = Vec::new();
    for f in library() {
        if !HTTP_FREE.contains(&f.module[0].as_str()) {
            continue;
        }
        let mut names = BTreeSet::new();
        idents(f.tokens, &mut names);
        let http: Vec<&&str> = HTTP_NAMES.iter().filter(|n| names.contains(**n)).collect();
        if !http.is_empty() {
            wrong.push(format!("{} names {http:?}", f.path.display()));
        }
    }
    assert!(wrong.is_empty(), "HTTP in a module that must not know it:\n{}", wrong.join("\n"));
}

/// The API and the UI read through `db::Reader` and change things only through actions
/// (their role check, approval rules and audit): neither names the store that writes.
#[test]
fn the_api_and_the_ui_never_hold_the_writing_store() {
    let mut wrong = Vec::new();
    for f in library() {
        if !["api", "ui"].contains(&f.module[0].as_str()) {
            continue;
        }
        let mut names = BTreeSet::new();
        idents(f.tokens, &mut names);
        if names.contains("Store") {
            wrong.push(f.path.display().to_string());
        }
    }
    assert!(
        wrong.is_empty(),
        "the writing store named in {wrong:?}: hold a db::Reader, write through actions"
    );
}

/// The reader itself: paths in groups, attributes and `super::` climbing to the root are
/// found; comments, strings and other crates' paths are not.
#[test]
fn the_reader_finds_every_form_of_crate_path() {
    let src = r#"
        use crate::{db::{Store, Role}, hub};
        use super::super::auth::Keys;
        #[utoipa::path(get, responses((status = 200, body = crate::diff::DiffEntry)))]
        fn f() { let _ = crate::fleet::FLUSH_INTERVAL; tracing::info!("crate::api"); }
        // crate::ui is only mentioned in a comment
        mod tests { use super::super::super::sync; use super::*; }
        use other::crate_like::web;
    "#;
    let mut refs = BTreeSet::new();
    crate_refs(src.parse().unwrap(), &["api".to_string(), "services".to_string()], &mut refs);
    let expected: BTreeSet<String> = ["auth", "db", "diff", "fleet", "hub", "sync"].map(String::from).into();
    assert_eq!(refs, expected);
}
