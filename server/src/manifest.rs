//! The manifest: the document `levee apply -f`, `levee export` / `levee get` and
//! `levee import` share.
//!
//! A manifest file holds one or more services. In YAML each service is one document
//! (documents separated by `---`), or a document is a sequence of services; in JSON the
//! file is one service object or an array of them (JSON is read as YAML, so both spellings
//! go through the same decoder and give the same errors).
//!
//! ```yaml
//! api_version: levee/v1
//! environment: prod
//! service: checkout
//! description: Takes orders
//! policy:                     # levee_agent::policy::Policy, every field optional
//!   dependencies:
//!     pricing:
//!       attempt_timeout: 300ms
//! flags:                      # levee_agent::policy::Flag by key; optional
//!   pricing.enabled: { type: bool, value: true }
//! ```
//!
//! Decoding is strict: unknown fields, duplicate keys, a sequence where a mapping belongs
//! and YAML 1.1 booleans (`yes`, `on`) are refused. Every error names the file, the
//! document, the path inside it (`policy.dependencies.pricing.retry.max_attempts`), the
//! line and column when the decoder knows them, and — for out-of-range values — the
//! allowed range (from the agent's `validate()`, the same check the server runs).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use levee_agent::policy::recover::{self, PathPart};
use levee_agent::policy::{FieldError, Flag, Policy, ServiceConfig, ValidationErrors, check_name};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// Version of the manifest shape, written as `api_version: levee/v1`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum ApiVersion {
    /// The first shape: environment, service, description, policy, flags.
    #[default]
    #[serde(rename = "levee/v1")]
    V1,
}

/// Longest service description, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 1000;

/// One service as kept in git: its identity, its policy and its flags.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceManifest {
    /// Shape version; must be `levee/v1`.
    pub api_version: ApiVersion,
    /// Environment name (`a-z 0-9 . _ -`, 1..=64).
    pub environment: String,
    /// Service name (`a-z 0-9 . _ -`, 1..=64).
    pub service: String,
    /// Free text, at most 1000 characters.
    #[serde(default)]
    pub description: String,
    /// The whole resilience policy; fields left out take the agent's defaults.
    pub policy: Policy,
    /// Flags by key; absent = no flags.
    #[serde(default)]
    pub flags: BTreeMap<String, Flag>,
}

impl ServiceManifest {
    /// A manifest with the default policy and no flags.
    pub fn new(environment: impl Into<String>, service: impl Into<String>) -> Self {
        Self {
            api_version: ApiVersion::V1,
            environment: environment.into(),
            service: service.into(),
            description: String::new(),
            policy: Policy::default(),
            flags: BTreeMap::new(),
        }
    }

    /// `environment/service`, as people name a service.
    pub fn key(&self) -> String {
        format!("{}/{}", self.environment, self.service)
    }

    /// The snapshot body agents would receive for this manifest (no faults, no overrides).
    pub fn to_config(&self) -> ServiceConfig {
        ServiceConfig { policy: self.policy.clone(), flags: self.flags.clone(), ..ServiceConfig::default() }
    }

    /// Checks names, the description, and policy and flags with the agent's `validate()`.
    ///
    /// Every bad field is reported, each with its path (`environment`, `description`,
    /// `policy.…`, `flags.<key>.…`), the value and the allowed range.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errors = Vec::new();
        for (field, value) in [("environment", &self.environment), ("service", &self.service)] {
            if let Err(m) = check_name(value) {
                errors.push(FieldError {
                    path: field.into(),
                    value: format!("{value:?}"),
                    message: format!("{field} name {m}"),
                });
            }
        }
        if self.description.len() > MAX_DESCRIPTION_BYTES {
            errors.push(FieldError {
                path: "description".into(),
                value: format!("{} bytes", self.description.len()),
                message: format!("must be at most {MAX_DESCRIPTION_BYTES} bytes"),
            });
        }
        if self.description.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
            errors.push(FieldError {
                path: "description".into(),
                value: format!("{:?}", self.description),
                message: "must not contain control characters".into(),
            });
        }
        if let Err(e) = self.to_config().validate() {
            errors.extend(e.0);
        }
        if errors.is_empty() { Ok(()) } else { Err(ValidationErrors(errors)) }
    }
}

/// One thing wrong with a manifest file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Document number in the file, from 1 (a sequence document counts each item).
    pub document: usize,
    /// `environment/service` of the document, when it got that far.
    pub service: Option<String>,
    /// Path of the bad field inside the document (`.` for the document itself).
    pub path: String,
    /// What is wrong and what is allowed.
    pub message: String,
    /// Line in the file, from 1, when the decoder knows it.
    pub line: Option<u64>,
    /// Column in the file, from 1, when the decoder knows it.
    pub column: Option<u64>,
}

/// Why a manifest file could not be used: every problem found, with the file's name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
pub struct ManifestError {
    /// The file as the user named it.
    pub file: String,
    /// Never empty.
    pub problems: Vec<Problem>,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}", self.file)?;
            if let Some(line) = p.line {
                write!(f, ":{line}")?;
                if let Some(col) = p.column {
                    write!(f, ":{col}")?;
                }
            }
            write!(f, ": document {}", p.document)?;
            if let Some(s) = &p.service {
                write!(f, " ({s})")?;
            }
            write!(f, ": {}: {}", p.path, p.message)?;
        }
        Ok(())
    }
}

impl ManifestError {
    fn one(file: &str, problem: Problem) -> Self {
        Self { file: file.to_string(), problems: vec![problem] }
    }
}

thread_local! {
    /// Path of the field where the last decoding failed on this thread. The YAML decoder's
    /// error type keeps only a message and a location, so the path (from
    /// serde_path_to_error) travels beside it; decoding is synchronous, so the failing
    /// call and `parse` run on the same thread.
    static FAILED_AT: std::cell::RefCell<Option<(String, Option<Vec<PathPart>>)>> =
        const { std::cell::RefCell::new(None) };
}

/// One document: a service, or a sequence of services.
struct Document(Vec<ServiceManifest>);

fn decode_one<'de, D: Deserializer<'de>>(d: D, index: Option<usize>) -> Result<ServiceManifest, D::Error> {
    serde_path_to_error::deserialize(d).map_err(|e| {
        let mut path = e.path().to_string();
        if let Some(i) = index {
            path = if path == "." || path.is_empty() { format!("[{i}]") } else { format!("[{i}].{path}") };
        }
        let parts = recover::path_parts(e.path());
        FAILED_AT.with(|f| *f.borrow_mut() = Some((path, parts)));
        e.into_inner()
    })
}

impl<'de> Deserialize<'de> for Document {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Document;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a service (a mapping with api_version, environment, service, policy) or a sequence of them")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Document, A::Error> {
                Ok(Document(vec![decode_one(de::value::MapAccessDeserializer::new(map), None)?]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Document, A::Error> {
                let mut out = Vec::new();
                while let Some(m) = seq.next_element_seed(Item(out.len()))? {
                    out.push(m);
                }
                Ok(Document(out))
            }
        }
        d.deserialize_any(V)
    }
}

struct Item(usize);

impl<'de> de::DeserializeSeed<'de> for Item {
    type Value = ServiceManifest;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ServiceManifest, D::Error> {
        decode_one(d, Some(self.0))
    }
}

fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! { strict_booleans: true }
}

/// For reading past the first problem: every duplicate key is reported on its own
/// ([`duplicate_keys`]), so the data read goes on with the later value.
fn lenient_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        duplicate_keys: serde_saphyr::options::DuplicateKeyPolicy::LastWins,
    }
}

/// The file as a tree of positions, one item per service (a sequence document gives
/// several); `None` when it is not YAML. Repeated keys are kept, so that each is seen.
fn located(text: &str) -> Option<Vec<locate::Located>> {
    let options = serde_saphyr::options! {
        strict_booleans: true,
        duplicate_keys: serde_saphyr::options::DuplicateKeyPolicy::PassThrough,
    };
    let docs = serde_saphyr::from_multiple_with_options::<locate::Located>(text, options).ok()?;
    Some(docs.into_iter().flat_map(locate::Located::items).collect())
}

/// Gives every problem without a place the line and column of the value its path names
/// in the file (or of the mapping that leaves the field out), then puts the problems in
/// file order.
fn locate(items: Option<&[locate::Located]>, problems: &mut [Problem]) {
    if let Some(items) = items {
        for p in problems.iter_mut().filter(|p| p.line.is_none()) {
            if let Some(doc) = p.document.checked_sub(1).and_then(|i| items.get(i)) {
                let (line, column) = doc.find(&p.path);
                (p.line, p.column) = (Some(line), Some(column));
            }
        }
    }
    problems.sort_by_key(|p| (p.document, p.line.unwrap_or(u64::MAX), p.column.unwrap_or(u64::MAX)));
}

/// The message of a key written twice in one mapping.
fn duplicate_message(key: &str) -> String {
    format!("duplicate key `{key}`: a key may appear only once in a mapping")
}

/// One problem per key written again in a mapping, in every item of the file, located at
/// the later occurrence; `services` names each item's service when it says it.
fn duplicate_keys(items: &[locate::Located], services: &[Option<String>]) -> Vec<Problem> {
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        out.extend(item.duplicates().into_iter().map(|(path, key, line, column)| Problem {
            document: i + 1,
            service: services.get(i).cloned().flatten(),
            path,
            message: duplicate_message(&key),
            line: Some(line),
            column: Some(column),
        }));
    }
    out
}

/// Decodes and validates every service of a manifest file (YAML or JSON).
///
/// `file` names the file in errors. Refuses an empty file, a document that is not a
/// service, unknown fields, out-of-range values and the same `environment/service` twice.
///
/// # Errors
/// [`ManifestError`] listing every problem: every invalid field of every document, and
/// when a field cannot be decoded, that one (with its line and column) and every other
/// problem found by skipping it ([`recover::decode_all`]).
pub fn parse(file: &str, text: &str) -> Result<Vec<ServiceManifest>, ManifestError> {
    let docs: Vec<Document> = serde_saphyr::from_multiple_with_options(text, yaml_options())
        .map_err(|e| with_the_rest(text, decode_error(file, text, &e)))?;
    let manifests: Vec<ServiceManifest> = docs.into_iter().flat_map(|d| d.0).collect();
    if manifests.is_empty() {
        return Err(ManifestError::one(
            file,
            Problem {
                document: 1,
                service: None,
                path: ".".into(),
                message: "holds no service: expected at least one document with api_version: levee/v1".into(),
                line: None,
                column: None,
            },
        ));
    }
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, m) in manifests.iter().enumerate() {
        let service = Some(m.key());
        if let Err(errors) = m.validate() {
            problems.extend(errors.0.into_iter().map(|e| Problem {
                document: i + 1,
                service: service.clone(),
                path: e.path.clone(),
                message: if e.value.is_empty() {
                    e.message
                } else {
                    format!("{} (got {})", e.message, e.value)
                },
                line: None,
                column: None,
            }));
        }
        if !seen.insert(m.key()) {
            problems.push(Problem {
                document: i + 1,
                service,
                path: ".".into(),
                message: "the same environment/service appears twice in this file".into(),
                line: None,
                column: None,
            });
        }
    }
    if problems.is_empty() {
        return Ok(manifests);
    }
    locate(located(text).as_deref(), &mut problems);
    Err(ManifestError { file: file.to_string(), problems })
}

/// Turns a decoder error into a problem: the path recorded by `decode_one`, the
/// decoder's message, and the location; the document number is counted from the `---`
/// lines before the error.
fn decode_error(file: &str, text: &str, e: &serde_saphyr::Error) -> ManifestError {
    let (path, parts) = FAILED_AT.with(|f| f.borrow_mut().take()).unwrap_or_else(|| (".".to_string(), None));
    let rendered = e.without_snippet().to_string();
    let (line, column) = match e.location() {
        Some(l) if l.line() > 0 => (Some(l.line()), Some(l.column())),
        _ => (None, None),
    };
    let mut message = strip_location(&rendered);
    let mut path = path;
    // The YAML decoder names a duplicate key in its message and not in the path (`a.?`),
    // and suggests one of its own options: say it in the manifest's terms.
    if let Some(rest) = message.strip_prefix("duplicate mapping key") {
        let key = rest.strip_prefix(": ").and_then(|r| r.split(", set DuplicateKeyPolicy").next());
        if let Some(key) = key {
            if let Some(parent) = path.strip_suffix(".?").or_else(|| path.strip_suffix('?')) {
                path = if parent.is_empty() || parent == "." {
                    key.to_string()
                } else {
                    format!("{parent}.{key}")
                };
            }
            message = duplicate_message(key);
        } else {
            message = "duplicate key: a key may appear only once in a mapping".to_string();
        }
    }
    // The decoder names a part of the path it could not read `?` (a syntax error inside a
    // mapping): the path stops at the last part it names.
    let path = without_unknown_parts(&path);
    let message = match parts {
        Some(p) => recover::explain(&p, &message),
        None => message,
    };
    let document = line.map_or(1, |l| document_at_line(text, l));
    ManifestError::one(file, Problem { document, service: None, path, message, line, column })
}

/// `path` without its `?` parts (`policy.dependencies.db.?` is `policy.dependencies.db`);
/// `.` when nothing is left.
fn without_unknown_parts(path: &str) -> String {
    let kept: Vec<&str> = path.split('.').filter(|part| *part != "?").collect();
    if kept.iter().all(|part| part.is_empty()) { ".".to_string() } else { kept.join(".") }
}

/// Adds to the one decoding problem `first` every other problem of the file: each
/// document (each item of a sequence document) is read as plain data, decoded with its
/// bad fields skipped one by one, and what remains is validated. The problem `first`
/// names keeps its place and its line and column. When the file cannot be read as plain
/// data (bad YAML syntax), `first` is all there is.
fn with_the_rest(text: &str, mut first: ManifestError) -> ManifestError {
    let Ok(docs) = serde_saphyr::from_multiple_with_options::<serde_json::Value>(text, lenient_options())
    else {
        return first;
    };
    let items = docs.into_iter().flat_map(|d| match d {
        serde_json::Value::Array(items) => items,
        other => vec![other],
    });
    let mut rest = Vec::new();
    let mut services = Vec::new();
    for (i, doc) in items.enumerate() {
        let name = |k: &str| doc.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let service = name("environment").zip(name("service")).map(|(e, s)| format!("{e}/{s}"));
        services.push(service.clone());
        let (decoded, mut errors) = recover::decode_all::<ServiceManifest>(doc);
        if let Some(m) = decoded
            && let Err(e) = m.validate()
        {
            errors.extend(e.0);
        }
        rest.extend(errors.into_iter().map(|e| Problem {
            document: i + 1,
            service: service.clone(),
            path: e.path,
            message: if e.value.is_empty() { e.message } else { format!("{} (got {})", e.message, e.value) },
            line: None,
            column: None,
        }));
    }
    let head = &mut first.problems[0];
    let same = |p: &Problem| {
        p.document == head.document && (p.path == head.path || head.path.ends_with(&format!("].{}", p.path)))
    };
    if let Some(i) = rest.iter().position(same) {
        // The same problem, decoded from plain data: its message is serde's usual one
        // (the YAML decoder says "invalid u32" where it says which value and type), with
        // the value; the place stays the YAML decoder's.
        let found = rest.remove(i);
        head.service = head.service.take().or(found.service);
        head.message = found.message;
    }
    let tree = located(text);
    if let Some(items) = &tree {
        // Every key written twice is a problem of its own: the data above kept the later
        // value and said nothing. The decoder's own first problem may be one of them.
        for dup in duplicate_keys(items, &services) {
            if head.line == dup.line && head.message == dup.message {
                head.service = head.service.take().or(dup.service);
            } else {
                rest.push(dup);
            }
        }
    }
    first.problems.extend(rest);
    locate(tree.as_deref(), &mut first.problems);
    first
}

/// Removes the location the decoder appends or prepends; it is reported separately.
fn strip_location(message: &str) -> String {
    let mut m = message.trim();
    if let Some(rest) = m.strip_prefix("error: ") {
        m = rest;
    }
    if m.starts_with("line ")
        && let Some((_, rest)) = m.split_once(": ")
    {
        m = rest;
    }
    if let Some(i) = m.rfind(" at line ") {
        m = &m[..i];
    }
    m.trim().to_string()
}

/// Document number (from 1) holding `line` (from 1): one more than the `---` separators
/// above it, not counting one that opens the file.
fn document_at_line(text: &str, line: u64) -> usize {
    let mut doc = 1;
    let mut content_seen = false;
    for l in text.lines().take(line.saturating_sub(1) as usize) {
        let t = l.trim_end();
        if t == "---" || t.starts_with("--- ") {
            if content_seen {
                doc += 1;
            }
            content_seen = false;
        } else if !t.trim_start().is_empty() && !t.trim_start().starts_with('#') {
            content_seen = true;
        }
    }
    doc
}

/// Writes services as YAML, one document each (`---` between them).
pub fn to_yaml(manifests: &[ServiceManifest]) -> String {
    let mut out = String::new();
    for (i, m) in manifests.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        // The model serializes to plain maps, strings and numbers; this cannot fail.
        out.push_str(&serde_saphyr::to_string(m).expect("a manifest always serializes to YAML"));
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// Writes services as pretty JSON: one object, or an array when there are several.
pub fn to_json(manifests: &[ServiceManifest]) -> String {
    let text = if manifests.len() == 1 {
        serde_json::to_string_pretty(&manifests[0])
    } else {
        serde_json::to_string_pretty(manifests)
    };
    text.expect("a manifest always serializes to JSON") + "\n"
}

mod locate;

#[cfg(test)]
mod tests;
