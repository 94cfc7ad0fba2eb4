//! Reporting every problem of a document instead of the first one the decoder meets, and
//! the allowed range of a value of the wrong type.
//!
//! serde stops at the first field it cannot decode (`max_attempts: -1` → "invalid value:
//! integer `-1`, expected u32"), which hides the other bad fields of the same document and
//! never says what *is* allowed. Two helpers fix that without a second copy of the ranges:
//!
//! * [`decode_all`] decodes a JSON value; on a decoding error it records the problem,
//!   removes the offending field (so it takes its default) and decodes again, until the
//!   document decodes or a problem cannot be skipped.
//! * [`explain`] rewrites the decoder's type names in words and adds the range
//!   `validate()` states for that path, found by validating a minimal document that holds
//!   only that field set to out-of-range probe values.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{FieldError, ServiceConfig};

/// Most problems [`decode_all`] collects from one document before it stops.
pub const MAX_PROBLEMS: usize = 50;

/// One step of a path into a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathPart {
    /// A mapping key or struct field.
    Key(String),
    /// A position in a sequence, from 0.
    Index(usize),
}

/// The steps of a decoder's error path; `None` when the path holds a step that is not a
/// key or an index (an enum variant, or a step the decoder could not name).
pub fn path_parts(path: &serde_path_to_error::Path) -> Option<Vec<PathPart>> {
    path.iter()
        .map(|s| match s {
            serde_path_to_error::Segment::Map { key } => Some(PathPart::Key(key.clone())),
            serde_path_to_error::Segment::Seq { index } => Some(PathPart::Index(*index)),
            _ => None,
        })
        .collect()
}

/// Renders steps the way `validate()` and the decoder name a field:
/// `policy.dependencies.pricing.retry.max_attempts`, `faults[0].action`.
pub fn render(parts: &[PathPart]) -> String {
    let mut out = String::new();
    for p in parts {
        match p {
            PathPart::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            PathPart::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    if out.is_empty() { ".".into() } else { out }
}

/// The decoder's type names, in words. Unsigned types name their whole range, so a
/// message always says what is allowed even when `validate()` adds nothing.
const TYPE_WORDS: &[(&str, &str, &str)] = &[
    // (decoder's name, words when validate() states the range, words alone)
    ("u8", "a whole number", "a whole number from 0 to 255"),
    ("u16", "a whole number", "a whole number from 0 to 65535"),
    ("u32", "a whole number", "a whole number from 0 to 4294967295"),
    ("u64", "a whole number", "a whole number from 0 to 18446744073709551615"),
    ("usize", "a whole number", "a whole number from 0 to 18446744073709551615"),
    ("i32", "an integer", "an integer"),
    ("i64", "an integer", "an integer"),
    ("f32", "a number", "a number"),
    ("f64", "a number", "a number"),
];

/// Values set at the failing path to make `validate()` state its range: too large and
/// too small for every numeric or duration field of the model.
const PROBES: &[fn() -> Value] = &[
    || Value::from(4_294_967_295u64),
    || Value::from(0u64),
    || Value::from("100000h"),
    || Value::from("0s"),
];

/// The decoder's `message` for the field at `parts`, with type names in words and, when
/// `validate()` states a range for that field, the range appended
/// (`invalid value: integer `-1`, expected a whole number; must be between 1 and 10`).
///
/// `parts` may start at any type that holds a [`ServiceConfig`] or a
/// [`Policy`](super::Policy): the range is looked up for every suffix of the path, as a
/// path of a snapshot body and as a path of its policy.
pub fn explain(parts: &[PathPart], message: &str) -> String {
    let hint = range_hint(parts);
    let mut out = message.to_string();
    for (ty, with_hint, alone) in TYPE_WORDS {
        let needle = format!("expected {ty}");
        if let Some(i) = out.find(&needle) {
            let end = i + needle.len();
            let boundary = out[end..].chars().next().is_none_or(|c| !c.is_ascii_alphanumeric());
            if boundary {
                let words = if hint.is_some() { with_hint } else { alone };
                out.replace_range(i..end, &format!("expected {words}"));
                break;
            }
        }
    }
    // serde names a struct by its Rust type (`expected struct Retry`); a user wrote YAML.
    if let Some(i) = out.find("expected struct ") {
        let start = i + "expected struct ".len();
        let end = out[start..]
            .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .map_or(out.len(), |n| start + n);
        out.replace_range(i..end, "expected a mapping");
    }
    match hint {
        Some(h) => {
            // serde_json appends the location; keep it last.
            match out.rfind(" at line ") {
                Some(i) => format!("{}; {h}{}", &out[..i], &out[i..]),
                None => format!("{out}; {h}"),
            }
        }
        None => out,
    }
}

/// What `validate()` says about the field at `parts` when it is out of range, if it
/// states a range for it.
fn range_hint(parts: &[PathPart]) -> Option<String> {
    let policy = [PathPart::Key("policy".into())];
    for start in 0..parts.len() {
        for prefix in [&[][..], &policy[..]] {
            let full: Vec<PathPart> = prefix
                .iter()
                .chain(&parts[start..])
                .map(|p| match p {
                    PathPart::Index(_) => PathPart::Index(0),
                    k => k.clone(),
                })
                .collect();
            let want = render(&full);
            for probe in PROBES {
                let Some(doc) = build(&full, probe()) else { continue };
                let Ok(cfg) = serde_json::from_value::<ServiceConfig>(doc) else { continue };
                if let Err(errors) = cfg.validate()
                    && let Some(e) = errors.0.into_iter().find(|e| e.path == want)
                {
                    return Some(e.message);
                }
            }
        }
    }
    None
}

/// A document holding only `leaf` at `parts` (indices must be 0).
fn build(parts: &[PathPart], leaf: Value) -> Option<Value> {
    let mut v = leaf;
    for p in parts.iter().rev() {
        v = match p {
            PathPart::Key(k) => Value::Object([(k.clone(), v)].into_iter().collect()),
            PathPart::Index(0) => Value::Array(vec![v]),
            PathPart::Index(_) => return None,
        };
    }
    Some(v)
}

/// Removes the value at `parts` from its parent mapping and returns it; `None` when the
/// path does not end in a key of a mapping that holds it.
fn remove(doc: &mut Value, parts: &[PathPart]) -> Option<Value> {
    let (last, parents) = parts.split_last()?;
    let mut node = doc;
    for p in parents {
        node = match p {
            PathPart::Key(k) => node.as_object_mut()?.get_mut(k)?,
            PathPart::Index(i) => node.as_array_mut()?.get_mut(*i)?,
        };
    }
    match last {
        PathPart::Key(k) => node.as_object_mut()?.remove(k),
        PathPart::Index(_) => None,
    }
}

/// Decodes `doc` as `T`, collecting every decoding problem: after each one the offending
/// field is removed and decoding starts again. Returns the value when what remains
/// decodes, and the problems in the order found (each with [`explain`]ed message and the
/// value removed). Stops at the first problem it cannot skip (a missing field, a bad
/// item of a sequence, a path it cannot follow) or after [`MAX_PROBLEMS`].
pub fn decode_all<T: DeserializeOwned>(mut doc: Value) -> (Option<T>, Vec<FieldError>) {
    let mut problems = Vec::new();
    let mut removed_paths: Vec<Vec<PathPart>> = Vec::new();
    loop {
        let err = match serde_path_to_error::deserialize::<_, T>(&doc) {
            Ok(v) => return (Some(v), problems),
            Err(e) => e,
        };
        let path = match err.path().to_string() {
            p if p == "?" || p.is_empty() => ".".to_string(),
            p => p,
        };
        let parts = path_parts(err.path());
        let raw = err.into_inner().to_string();
        let message = match &parts {
            Some(p) => explain(p, &raw),
            None => raw.clone(),
        };
        // A required field removed for its bad value is now missing: that is the same
        // problem again, already reported, and nothing further can be skipped.
        if let Some(field) = raw.strip_prefix("missing field `").and_then(|r| r.split('`').next())
            && removed_paths.iter().any(|r: &Vec<PathPart>| {
                parts.as_deref().is_some_and(|p| r.len() == p.len() + 1 && r.starts_with(p))
                    && r.last() == Some(&PathPart::Key(field.to_string()))
            })
        {
            return (None, problems);
        }
        let removed = parts.as_deref().and_then(|p| remove(&mut doc, p));
        if removed.is_some()
            && let Some(p) = &parts
        {
            removed_paths.push(p.clone());
        }
        let value = removed.as_ref().map(Value::to_string).unwrap_or_default();
        problems.push(FieldError { path, value, message });
        if removed.is_none() || problems.len() >= MAX_PROBLEMS {
            return (None, problems);
        }
    }
}
