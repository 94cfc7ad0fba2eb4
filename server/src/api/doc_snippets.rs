//! Every policy and request snippet in `docs/*.md` and `README.md` decodes with the real
//! types, strictly (unknown fields refused), so the documentation cannot drift from the API
//! (a count window written `{type: count, calls: 100}` once survived in docs/patterns.md
//! although the field is `size`).
//!
//! What counts as a snippet, outside fenced code blocks:
//! * an inline code span that is a JSON object, `{"type": "count", "size": 100}`: it must
//!   decode as one of the policy model's types or an API request type ([`decoders`]);
//! * an inline code span `path: value` with a dotted field path (quoted segments allowed)
//!   and a JSON value, `operations."POST /charge".idempotent: true`: the value nested
//!   under the path must decode as one of those types;
//! * any other inline code span starting with `{` is a list of field names
//!   (`POST {name, description, reason}`): every name must be a property of a schema of the
//!   OpenAPI document.
//!
//! In fenced blocks: a ```` ```json ```` block must decode as one of the types, or, when its
//! info string says `response`, name only properties of the OpenAPI document; the body
//! (`-d '…'`) of every `curl` in a ```` ```sh ```` block must decode as the request type of
//! its method and path, and a service it creates must validate whole (policy and flags
//! together, as the server checks it). ```` ```rust ```` blocks are the agent crate's
//! doctests (`levee_agent::DocsAreDoctests`). A block right after a `<!-- check: … -->`
//! marker is checked by the test that reads that marker, not here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use levee_agent::policy as model;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::auth_routes::LoginRequest;
use super::envs::CreateEnvironment;
use super::flags::{PatchFlag, PutFlag};
use super::overrides::{PutFault, PutOverride};
use super::services::{CreateService, PutPolicy, Rollback};

/// Decodes `value` strictly as `T`.
fn strict<T: DeserializeOwned>(value: &Value) -> Result<(), String> {
    serde_json::from_value::<T>(value.clone()).map(|_| ()).map_err(|e| e.to_string())
}

type Decoder = (&'static str, fn(&Value) -> Result<(), String>);

/// The types a snippet may be written in: every type of the policy model and every JSON
/// request body of the API.
fn decoders() -> Vec<Decoder> {
    vec![
        ("ServiceConfig", strict::<model::ServiceConfig>),
        ("Policy", strict::<model::Policy>),
        ("Dependency", strict::<model::DependencyPolicy>),
        ("Operation", strict::<model::Operation>),
        ("Retry", strict::<model::Retry>),
        ("RetryBudget", strict::<model::RetryBudgetPolicy>),
        ("Window", strict::<model::Window>),
        ("CircuitBreaker", strict::<model::CircuitBreakerPolicy>),
        ("Bulkhead", strict::<model::BulkheadPolicy>),
        ("OutlierDetection", strict::<model::OutlierDetection>),
        ("Inbound", strict::<model::Inbound>),
        ("Limit", strict::<model::Limit>),
        ("Queue", strict::<model::Queue>),
        ("Route", strict::<model::Route>),
        ("MatrixRow", strict::<model::MatrixRow>),
        ("Flag", strict::<model::Flag>),
        ("StalePolicy", strict::<model::StalePolicy>),
        ("Rollout", strict::<model::Rollout>),
        ("FaultRule", strict::<model::FaultRule>),
        ("FaultAction", strict::<model::FaultAction>),
        ("BreakerOverride", strict::<model::BreakerOverride>),
        ("LeverOverride", strict::<model::LeverOverride>),
        ("CreateEnvironment", strict::<CreateEnvironment>),
        ("CreateService", strict::<CreateService>),
        ("PutPolicy", strict::<PutPolicy>),
        ("PutFlag", strict::<PutFlag>),
        ("PatchFlag", strict::<PatchFlag>),
        ("PutOverride", strict::<PutOverride>),
        ("PutFault", strict::<PutFault>),
        ("Rollback", strict::<Rollback>),
        ("CreateToken", strict::<super::tokens::CreateToken>),
        ("CreateUser", strict::<super::tokens::CreateUser>),
        ("LoginRequest", strict::<LoginRequest>),
        ("Experiment", strict::<crate::experiments::ExperimentSpec>),
        ("Probe", strict::<crate::experiments::Probe>),
        ("BlastRadius", strict::<crate::experiments::BlastRadius>),
        ("StartExperiment", strict::<super::experiments::StartExperiment>),
        ("StopExperiment", strict::<super::experiments::StopExperiment>),
    ]
}

/// `Ok(type name)` when `value` decodes as one of the [`decoders`], else every type's
/// complaint.
fn decodes_as_some_type(value: &Value) -> Result<&'static str, String> {
    let mut why = Vec::new();
    for (name, decode) in decoders() {
        match decode(value) {
            Ok(()) => return Ok(name),
            Err(e) => why.push(format!("{name}: {e}")),
        }
    }
    Err(why.join("\n    "))
}

/// The request type of an API call, by method and path (`/api/v1` stripped).
fn request_decoder(method: &str, path: &str) -> Option<Decoder> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let decoder: Decoder = match (method, segments.as_slice()) {
        ("POST", ["auth", "login"]) => ("LoginRequest", strict::<LoginRequest>),
        ("POST", ["environments"]) => ("CreateEnvironment", strict::<CreateEnvironment>),
        ("POST", ["environments", _, "services"]) => ("CreateService", create_service),
        ("PUT", ["environments", _, "services", _, "policy"]) => ("PutPolicy", strict::<PutPolicy>),
        ("PUT", ["environments", _, "services", _, "flags", _]) => ("PutFlag", strict::<PutFlag>),
        ("PATCH", ["environments", _, "services", _, "flags", _]) => ("PatchFlag", strict::<PatchFlag>),
        ("PUT", ["environments", _, "services", _, "breaker-overrides", _]) => {
            ("PutOverride", strict::<PutOverride>)
        }
        ("PUT", ["environments", _, "services", _, "faults", _]) => ("PutFault", strict::<PutFault>),
        ("POST", ["environments", _, "services", _, "rollback"]) => ("Rollback", strict::<Rollback>),
        ("POST", ["tokens"]) => ("CreateToken", strict::<super::tokens::CreateToken>),
        ("POST", ["users"]) => ("CreateUser", strict::<super::tokens::CreateUser>),
        ("POST", ["ofrep", "v1", "evaluate", "flags", ..]) => ("an OFREP evaluation request", ofrep_request),
        _ => return None,
    };
    Some(decoder)
}

/// An OFREP evaluation request, read by the parser the endpoints use.
fn ofrep_request(value: &Value) -> Result<(), String> {
    levee_agent::ofrep::parse_request(value.to_string().as_bytes()).map(|_| ()).map_err(|f| f.error_details)
}

/// A service as `POST .../services` creates it: decoded, then validated whole, as the
/// server does before storing it (kill switches must name its flags, OPS-1).
fn create_service(value: &Value) -> Result<(), String> {
    let req: CreateService = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    let cfg = model::ServiceConfig {
        policy: req.policy.unwrap_or_default(),
        flags: req.flags,
        ..Default::default()
    };
    cfg.validate().map_err(|e| e.to_string())
}

/// Every property name of every schema of the OpenAPI document.
fn openapi_properties() -> BTreeSet<String> {
    fn walk(v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Object(props)) = m.get("properties") {
                    out.extend(props.keys().cloned());
                }
                m.values().for_each(|c| walk(c, out));
            }
            Value::Array(a) => a.iter().for_each(|c| walk(c, out)),
            _ => {}
        }
    }
    let doc =
        serde_json::to_value(<super::openapi::ApiDoc as utoipa::OpenApi>::openapi()).expect("serializes");
    let mut out = BTreeSet::new();
    walk(&doc, &mut out);
    out
}

/// Every key of every object in `v`.
fn keys(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                out.push(k.clone());
                keys(c, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|c| keys(c, out)),
        _ => {}
    }
}

/// A piece of a document to check, with where it is.
#[derive(Debug, PartialEq)]
enum Snippet {
    /// An inline code span (newlines folded to spaces).
    Inline(String),
    /// A fenced block: info string and content.
    Fenced(String, String),
}

/// The inline code spans and fenced blocks of a markdown document, with line numbers.
fn snippets(text: &str) -> Vec<(usize, Snippet)> {
    let mut out = Vec::new();
    let mut fence: Option<(usize, String, String)> = None;
    let mut prose = String::new();
    let mut prose_start = 1;
    // A block right after `<!-- check: … -->` belongs to the test that marker names (e.g.
    // docs/importers.md's manifests, checked by tests/import): it is left to that test.
    let mut marked = false;
    let flush = |prose: &mut String, start: usize, out: &mut Vec<(usize, Snippet)>| {
        let mut rest = prose.as_str();
        let mut line = start;
        while let Some(open) = rest.find('`') {
            line += rest[..open].matches('\n').count();
            let after = &rest[open + 1..];
            let Some(close) = after.find('`') else { break };
            out.push((line, Snippet::Inline(after[..close].replace('\n', " "))));
            line += after[..close].matches('\n').count();
            rest = &after[close + 1..];
        }
        prose.clear();
    };
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        match &mut fence {
            Some((start, info, body)) => {
                if line.trim_start().starts_with("```") {
                    out.push((*start, Snippet::Fenced(std::mem::take(info), std::mem::take(body))));
                    fence = None;
                    prose_start = n + 1;
                } else {
                    body.push_str(line);
                    body.push('\n');
                }
            }
            None => {
                if let Some(info) = line.trim_start().strip_prefix("```") {
                    flush(&mut prose, prose_start, &mut out);
                    let info = if marked { "checked-elsewhere".to_string() } else { info.trim().to_string() };
                    fence = Some((n, info, String::new()));
                    marked = false;
                } else if line.trim_start().starts_with("<!-- check:") {
                    flush(&mut prose, prose_start, &mut out);
                    prose_start = n + 1;
                    marked = true;
                } else if line.trim().is_empty() {
                    // A code span never crosses a paragraph.
                    flush(&mut prose, prose_start, &mut out);
                    prose_start = n + 1;
                } else {
                    prose.push_str(line);
                    prose.push('\n');
                }
            }
        }
    }
    flush(&mut prose, prose_start, &mut out);
    out
}

/// `path: value` with a dotted field path (segments `a_b` or `"quoted"`) and a JSON value:
/// the value nested under the path.
fn path_assignment(span: &str) -> Option<Result<Value, String>> {
    let (path, value) = span.split_once(": ")?;
    if path.starts_with('"') {
        return None; // a JSON member (`"kind": "api"`), not a path
    }
    let mut segments = Vec::new();
    let mut rest = path;
    while !rest.is_empty() {
        let (segment, tail) = if let Some(quoted) = rest.strip_prefix('"') {
            let end = quoted.find('"')?;
            (quoted[..end].to_string(), &quoted[end + 1..])
        } else {
            let end = rest.find('.').unwrap_or(rest.len());
            let s = &rest[..end];
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                return None;
            }
            (s.to_string(), &rest[end..])
        };
        segments.push(segment);
        rest = match tail.strip_prefix('.') {
            Some(t) => t,
            None if tail.is_empty() => tail,
            None => return None,
        };
    }
    // A value that does not even start like JSON (`authorization: Bearer <token>`) makes
    // the span a header or prose, not a snippet.
    if !value.starts_with(['{', '[', '"', '-', 't', 'f', 'n'])
        && !value.starts_with(|c: char| c.is_ascii_digit())
    {
        return None;
    }
    let value: Value = match serde_json::from_str(value) {
        Ok(v) => v,
        Err(e) => return Some(Err(format!("the value of `{path}` is not JSON: {e}"))),
    };
    Some(Ok(segments.into_iter().rev().fold(value, |v, k| Value::Object([(k, v)].into_iter().collect()))))
}

/// A field list with the method that takes it stripped: `PUT {policy, reason}` →
/// `{policy, reason}`.
fn strip_method(span: &str) -> &str {
    ["GET ", "POST ", "PUT ", "PATCH ", "DELETE "]
        .iter()
        .find_map(|m| span.strip_prefix(m).filter(|rest| rest.starts_with('{')))
        .unwrap_or(span)
}

/// The field names of a field list such as `{name, description?, state: a|b, "hash"}`.
fn field_list(span: &str) -> Vec<String> {
    let inner = span.trim_start_matches('{').trim_end_matches('}');
    inner
        .split(',')
        .map(|f| f.split(':').next().unwrap_or("").trim().trim_matches('"').trim_end_matches('?').to_string())
        .filter(|f| !f.is_empty() && f != "…")
        .collect()
}

/// The `curl` calls of a shell block: method, API path and the `-d '…'` body (which may
/// span lines), if any.
fn curl_calls(block: &str) -> Vec<(String, String, Option<String>)> {
    let mut out = Vec::new();
    for call in block.split("curl ").skip(1) {
        // A call's own text: up to the end of its line, or of its quoted body.
        let Some(api) = call.lines().next().and_then(|l| l.find("$API")) else { continue };
        let path: String = call[api + 4..].chars().take_while(|c| !c.is_whitespace() && *c != '"').collect();
        let call = call.replace("\\\n", " ");
        let body = call.find("-d '").and_then(|d| {
            let rest = &call[d + 4..];
            rest.find('\'').map(|end| rest[..end].to_string())
        });
        let method = match call.find("-X ") {
            Some(x) => call[x + 3..].split_whitespace().next().unwrap_or("GET").to_string(),
            None if body.is_some() => "POST".to_string(),
            None => "GET".to_string(),
        };
        out.push((method, path.split('?').next().unwrap_or("").to_string(), body));
    }
    out
}

/// The problems of one document (empty when every snippet checks), and how many snippets
/// were checked.
fn check_document(name: &str, text: &str, properties: &BTreeSet<String>) -> (Vec<String>, usize) {
    let mut problems = Vec::new();
    let mut checked = 0;
    let mut fail =
        |line: usize, what: &str, why: String| problems.push(format!("{name}:{line}: {what}\n    {why}"));
    for (line, snippet) in snippets(text) {
        match snippet {
            Snippet::Inline(span) => {
                let span = strip_method(span.trim());
                if span.starts_with('{') {
                    checked += 1;
                    match serde_json::from_str::<Value>(span) {
                        Ok(v) => {
                            if let Err(why) = decodes_as_some_type(&v) {
                                fail(line, &format!("`{span}` decodes as no policy or request type"), why);
                            }
                        }
                        Err(_) => {
                            for f in field_list(span) {
                                if !properties.contains(&f) {
                                    fail(line, &format!("`{span}`"), format!("`{f}` is no field of the API"));
                                }
                            }
                        }
                    }
                } else if span.starts_with('"') && span.contains("\": ") {
                    // A JSON member, `"kind": "agent"`: its name is a field of the API.
                    checked += 1;
                    let name = span[1..].split('"').next().unwrap_or("");
                    if !properties.contains(name) {
                        fail(line, &format!("`{span}`"), format!("`{name}` is no field of the API"));
                    }
                } else if let Some(assignment) = path_assignment(span) {
                    checked += 1;
                    match assignment.and_then(|v| decodes_as_some_type(&v)) {
                        Ok(_) => {}
                        Err(why) => {
                            fail(line, &format!("`{span}` decodes as no policy or request type"), why)
                        }
                    }
                }
            }
            Snippet::Fenced(info, body) => {
                let mut words = info.split_whitespace();
                match words.next() {
                    Some("json") => {
                        checked += 1;
                        let response = words.any(|w| w == "response");
                        match serde_json::from_str::<Value>(&body) {
                            Err(e) => fail(line, "json block", format!("not JSON: {e}")),
                            Ok(v) if response => {
                                let mut ks = Vec::new();
                                keys(&v, &mut ks);
                                for k in ks.into_iter().filter(|k| !properties.contains(k)) {
                                    fail(
                                        line,
                                        "json response example",
                                        format!("`{k}` is no field of the API"),
                                    );
                                }
                            }
                            Ok(v) => {
                                if let Err(why) = decodes_as_some_type(&v) {
                                    fail(line, "json block decodes as no policy or request type", why);
                                }
                            }
                        }
                    }
                    Some("sh") => {
                        for (method, path, body) in curl_calls(&body) {
                            let Some(body) = body else { continue };
                            checked += 1;
                            let what = format!("curl -X {method} $API{path}");
                            let Some((ty, decode)) = request_decoder(&method, &path) else {
                                fail(line, &what, "no request type is known for this call: add it".into());
                                continue;
                            };
                            match serde_json::from_str::<Value>(&body) {
                                Err(e) => fail(line, &what, format!("body is not JSON: {e}")),
                                Ok(v) => {
                                    if let Err(why) = decode(&v) {
                                        fail(line, &what, format!("body is no valid {ty}: {why}"));
                                    }
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    (problems, checked)
}

fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        // importers.md quotes the sources' own settings (`attempts: 0` is Istio's): its
        // Levee examples are checked by tests/import, which reads its `<!-- check -->` marks.
        .filter(|p| !p.ends_with("importers.md"))
        .collect();
    docs.sort();
    docs.push(root.join("README.md"));
    docs
}

#[test]
fn every_policy_snippet_in_the_docs_decodes_with_the_real_types() {
    let properties = openapi_properties();
    let mut problems = Vec::new();
    let mut checked = 0;
    for path in documents() {
        let text = std::fs::read_to_string(&path).expect("readable");
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let (p, n) = check_document(&name, &text, &properties);
        problems.extend(p);
        checked += n;
    }
    assert!(problems.is_empty(), "{} snippet problem(s):\n{}", problems.len(), problems.join("\n"));
    // The checker found the snippets it is meant to check (patterns.md alone has several).
    println!("{checked} snippets checked");
    assert!(checked >= 20, "only {checked} snippets found: is the extraction broken?");
}

/// The checker itself: the drift that happened is caught, in each form a snippet takes.
#[test]
fn the_snippet_checker_catches_a_wrong_field() {
    let properties = openapi_properties();
    let bad = "Window: `{\"type\": \"count\", \"calls\": 100}`, or\n`circuit_breaker.window: {\"type\": \"count\",\n\"size\": 100, \"calls\": 5}`.\n\n\
               `inbound.retries_pausd: true` and `PUT {policy, reasn}` and `{type: count, callz: 100}`\n\n\
               ```json\n{\"policy\": {\"dependencys\": {}}}\n```\n\n\
               ```sh\ncurl -s $API/environments -H \"$AUTH\" -d '{\"name\":\"prod\",\"reasons\":\"x\"}'\n\
               curl -s $API/environments/prod/services -H \"$AUTH\" -d '{\"name\": \"c\", \"reason\": \"r\",\n\
               \"policy\": {\"dependencies\": {\"r\": {\"enabled_flag\": \"r.on\"}}}}'\n```\n";
    let (problems, checked) = check_document("bad.md", bad, &properties);
    assert_eq!(checked, 8, "{problems:#?}");
    let lines: Vec<&str> = problems.iter().map(|p| p.lines().next().unwrap()).collect();
    assert_eq!(
        lines,
        vec![
            "bad.md:1: `{\"type\": \"count\", \"calls\": 100}` decodes as no policy or request type",
            "bad.md:2: `circuit_breaker.window: {\"type\": \"count\", \"size\": 100, \"calls\": 5}` decodes as no policy or request type",
            "bad.md:5: `inbound.retries_pausd: true` decodes as no policy or request type",
            "bad.md:5: `{policy, reasn}`",
            "bad.md:5: `{type: count, callz: 100}`",
            "bad.md:7: json block decodes as no policy or request type",
            "bad.md:11: curl -X POST $API/environments",
            "bad.md:11: curl -X POST $API/environments/prod/services",
        ],
        "{problems:#?}"
    );
    assert!(problems[3].contains("`reasn` is no field"), "{}", problems[3]);
    assert!(problems[7].contains("policy.dependencies.r.enabled_flag"), "{}", problems[7]);
}
