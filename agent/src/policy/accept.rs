//! The one rule of what an agent accepts as a snapshot body.
//!
//! [`accept`] is called by both halves: by the agent on every pushed, polled and cached
//! snapshot before applying it, and by the server on the exact bytes it is about to store
//! as a revision, so that a revision every agent would reject is never stored. It checks,
//! in this order, each check bounding the cost of the next:
//!
//! 1. the schema version ([`SCHEMA_VERSION`]);
//! 2. the size ([`MAX_SNAPSHOT_BYTES`]);
//! 3. UTF-8;
//! 4. decoding and `validate()` ([`decode_config`]): like every decoder of the module it
//!    first refuses nesting of arrays and objects past [`MAX_BODY_DEPTH`] ([`too_deep`], a
//!    scan of the bytes that never recurses); then the counts (`defaults::MAX_FLAGS`,
//!    `MAX_DEPENDENCIES`, `MAX_ROUTES`, …), the size and depth of each flag value, and
//!    every range.
//!
//! [`MAX_SNAPSHOT_BYTES`]: super::defaults::MAX_SNAPSHOT_BYTES
//! [`MAX_BODY_DEPTH`]: super::defaults::MAX_BODY_DEPTH

use super::defaults::{MAX_BODY_DEPTH, MAX_SNAPSHOT_BYTES};
use super::{FieldError, PolicyError, SCHEMA_VERSION, ServiceConfig, decode_config};

/// Decides whether a snapshot body of `schema_version` is one this agent applies, and
/// decodes it.
///
/// # Errors
/// [`PolicyError::Refused`] naming `schema_version` for a version this agent does not read,
/// `.` (the body) over the size budget, or the path where nesting goes past the depth
/// budget, with the limit in the message and what was found as the value (`"1300000
/// bytes"`, `"130 levels"`); else what [`decode_config`] returns:
/// [`PolicyError::Malformed`] with the path, [`PolicyError::Invalid`] listing every
/// out-of-range field.
pub fn accept(schema_version: u32, body: &[u8]) -> Result<ServiceConfig, PolicyError> {
    if schema_version != SCHEMA_VERSION {
        return Err(PolicyError::Refused(FieldError {
            path: "schema_version".into(),
            value: schema_version.to_string(),
            message: format!("must be {SCHEMA_VERSION}, the only schema version this agent reads"),
        }));
    }
    if body.len() > MAX_SNAPSHOT_BYTES {
        let scan = scan(body, MAX_BODY_DEPTH);
        return Err(PolicyError::Refused(FieldError {
            path: ".".into(),
            value: format!("{} bytes", body.len()),
            message: format!(
                "the snapshot must be at most {MAX_SNAPSHOT_BYTES} bytes{}",
                largest_parts(&scan.parts)
            ),
        }));
    }
    if let Err(e) = std::str::from_utf8(body) {
        return Err(PolicyError::Malformed {
            path: ".".into(),
            message: format!("the snapshot is not UTF-8: {e}"),
            value: String::new(),
            also: Vec::new(),
        });
    }
    decode_config(body)
}

/// The refusal of a JSON text nested deeper than [`MAX_BODY_DEPTH`], naming where. Every
/// document decoder of the module runs it first, so past that depth nothing reaches serde
/// (whose own limit, 128 levels, would only say "recursion limit exceeded").
pub(super) fn too_deep(text: &[u8]) -> Option<PolicyError> {
    let scan = scan(text, MAX_BODY_DEPTH);
    scan.over.map(|path| {
        PolicyError::Refused(FieldError {
            path,
            value: format!("{} levels", scan.deepest),
            message: format!("must nest arrays and objects at most {MAX_BODY_DEPTH} levels deep"),
        })
    })
}

/// `"; largest parts: flags 900000 bytes, policy 2000 bytes"` (at most three), or nothing.
fn largest_parts(parts: &[(String, usize)]) -> String {
    let mut parts: Vec<&(String, usize)> = parts.iter().collect();
    parts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let shown: Vec<String> = parts.iter().take(3).map(|(k, n)| format!("{k} {n} bytes")).collect();
    if shown.is_empty() { String::new() } else { format!("; largest parts: {}", shown.join(", ")) }
}

/// What one pass over a JSON text found.
#[derive(Debug, Default, PartialEq, Eq)]
struct Scan {
    /// The deepest nesting of arrays and objects.
    deepest: usize,
    /// Where the nesting first went past the limit: the path of the array or object that
    /// did (as `validate()` writes paths; the first eight steps, then `…`).
    over: Option<String>,
    /// Each member of the top-level object and the bytes of its value.
    parts: Vec<(String, usize)>,
}

/// One step of a path: a member of an object (its key's bytes in the text) or an element
/// of an array.
#[derive(Clone, Debug)]
enum Step {
    Key(std::ops::Range<usize>),
    Index(usize),
    /// Inside an object, before the first key.
    None,
}

/// Steps of a path written out before it is cut with `…`.
const PATH_STEPS_SHOWN: usize = 8;

/// Measures nesting and the top-level members of `text` in one pass over its bytes,
/// without recursion and with memory bounded by `limit` whatever the input (a text of a
/// million `[` costs a counter, not a million frames). Not a validator: malformed JSON is
/// measured as far as it goes, and the decoder reports it afterwards.
fn scan(text: &[u8], limit: usize) -> Scan {
    let mut out = Scan::default();
    // The open containers down to `limit`, each with the step to its current child.
    let mut open: Vec<(u8, Step)> = Vec::new();
    let mut depth = 0usize;
    let mut last_string = 0..0;
    // The top-level member being read: its key and where its value starts.
    let mut member: Option<(std::ops::Range<usize>, usize)> = None;
    let key_text = |r: &std::ops::Range<usize>| String::from_utf8_lossy(&text[r.clone()]).into_owned();
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < text.len() && text[i] != b'"' {
                    i += if text[i] == b'\\' { 2 } else { 1 };
                }
                last_string = start..i.min(text.len());
            }
            open_char @ (b'{' | b'[') => {
                depth += 1;
                out.deepest = out.deepest.max(depth);
                if depth > limit {
                    if out.over.is_none() {
                        out.over = Some(path(&open, text));
                    }
                } else {
                    open.push((open_char, if open_char == b'[' { Step::Index(0) } else { Step::None }));
                }
            }
            b'}' | b']' => {
                if depth <= limit {
                    open.pop();
                }
                if depth == 1
                    && let Some((key, start)) = member.take()
                {
                    out.parts.push((key_text(&key), trimmed_len(&text[start..i])));
                }
                depth = depth.saturating_sub(1);
            }
            b':' if depth <= limit => {
                if let Some((b'{', step)) = open.last_mut() {
                    *step = Step::Key(last_string.clone());
                }
                if depth == 1 {
                    member = Some((last_string.clone(), i + 1));
                }
            }
            b',' if depth <= limit => {
                if let Some((b'[', Step::Index(n))) = open.last_mut() {
                    *n += 1;
                }
                if depth == 1
                    && let Some((key, start)) = member.take()
                {
                    out.parts.push((key_text(&key), trimmed_len(&text[start..i])));
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Length of `value` without the whitespace around it.
fn trimmed_len(value: &[u8]) -> usize {
    value.trim_ascii().len()
}

/// The path of the innermost of `open` containers' current children, as `validate()`
/// writes paths (`flags.key.value[0]`), cut after [`PATH_STEPS_SHOWN`] steps.
fn path(open: &[(u8, Step)], text: &[u8]) -> String {
    let mut out = String::new();
    for (n, (_, step)) in open.iter().enumerate() {
        if n == PATH_STEPS_SHOWN {
            out.push('…');
            break;
        }
        match step {
            Step::Key(r) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&String::from_utf8_lossy(&text[r.clone()]));
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
            Step::None => {}
        }
    }
    if out.is_empty() { ".".into() } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::defaults::MAX_FLAG_VALUE_DEPTH;
    use crate::policy::{decode_json, decode_policy};

    fn nested(levels: usize) -> String {
        format!("{}{}", "[".repeat(levels), "]".repeat(levels))
    }

    fn json_flag(value: &str) -> String {
        format!(r#"{{"flags": {{"deep": {{"type": "json", "value": {value}}}}}}}"#)
    }

    fn refused<T: std::fmt::Debug>(r: Result<T, PolicyError>) -> FieldError {
        match r {
            Err(PolicyError::Refused(e)) => e,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// The budgets leave room under what the decoder and the transport take, whatever the
    /// counts allow: a flag value at its own limit fits the body's, and a body at its limit
    /// fits a message with room for the envelope.
    #[test]
    fn budgets_are_inside_the_decoder_and_the_transport() {
        // The relations themselves are compile-time assertions in `defaults.rs`.
        accept(SCHEMA_VERSION, json_flag(&nested(MAX_FLAG_VALUE_DEPTH)).as_bytes()).unwrap();
    }

    #[test]
    fn an_empty_configuration_is_accepted() {
        assert_eq!(accept(SCHEMA_VERSION, b"{}").unwrap(), ServiceConfig::default());
    }

    #[test]
    fn an_unknown_schema_version_is_refused_by_name() {
        let e = refused(accept(SCHEMA_VERSION + 1, b"{}"));
        assert_eq!(e.path, "schema_version");
        assert_eq!(e.value, (SCHEMA_VERSION + 1).to_string());
        assert!(e.message.contains(&SCHEMA_VERSION.to_string()), "{e}");
    }

    /// CD-1: a body past the size budget is refused with the size, the limit and the parts
    /// that make it large, before it is decoded.
    #[test]
    fn cd_1_a_body_over_the_size_budget_is_refused_with_its_largest_parts() {
        let blob = format!("\"{}\"", "x".repeat(15_000));
        let flags: Vec<String> =
            (0..80).map(|i| format!(r#""f{i}": {{"type": "string", "value": {blob}}}"#)).collect();
        let body = format!(r#"{{"policy": {{}}, "flags": {{{}}}}}"#, flags.join(", "));
        assert!(body.len() > MAX_SNAPSHOT_BYTES);
        let e = refused(accept(SCHEMA_VERSION, body.as_bytes()));
        assert_eq!(e.path, ".");
        assert_eq!(e.value, format!("{} bytes", body.len()));
        assert!(e.message.contains(&MAX_SNAPSHOT_BYTES.to_string()), "{e}");
        let flags_len = body.find("\"flags\": ").map(|at| body.len() - at - "\"flags\": ".len() - 1).unwrap();
        assert!(
            e.message.contains(&format!("largest parts: flags {flags_len} bytes, policy 2 bytes")),
            "{e}"
        );
    }

    /// CD-1: nesting past the body's budget is refused with where it went too deep, even
    /// past serde_json's own limit (which would only say "recursion limit exceeded").
    #[test]
    fn cd_1_a_body_nested_too_deep_is_refused_with_the_path() {
        let e = refused(accept(SCHEMA_VERSION, json_flag(&nested(125)).as_bytes()));
        assert_eq!(e.path, "flags.deep.value[0][0][0][0][0]…");
        assert_eq!(e.value, "128 levels");
        assert!(e.message.contains(&MAX_BODY_DEPTH.to_string()), "{e}");
        // Within the body's budget but past the flag value's: validate() names the flag.
        let too_deep = MAX_FLAG_VALUE_DEPTH + 1;
        match accept(SCHEMA_VERSION, json_flag(&nested(too_deep)).as_bytes()) {
            Err(PolicyError::Invalid(v)) => {
                assert_eq!(v.0.len(), 1, "{v}");
                assert_eq!(v.0[0].path, "flags.deep.value");
                assert_eq!(v.0[0].value, format!("{too_deep} levels"));
                assert!(v.0[0].message.contains(&MAX_FLAG_VALUE_DEPTH.to_string()), "{v}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// Every document decoder refuses the same depth the same way, so a request body too
    /// deep is answered as clearly as a snapshot.
    #[test]
    fn every_decoder_refuses_nesting_past_the_budget() {
        let deep = format!(r#"{{"x": {}}}"#, nested(MAX_BODY_DEPTH));
        assert_eq!(
            refused(decode_json::<serde_json::Value>(deep.as_bytes())).path,
            "x[0][0][0][0][0][0][0]…"
        );
        assert_eq!(refused(decode_policy(deep.as_bytes())).value, format!("{} levels", MAX_BODY_DEPTH + 1));
        let ok = format!(r#"{{"x": {}}}"#, nested(MAX_BODY_DEPTH - 1));
        decode_json::<serde_json::Value>(ok.as_bytes()).unwrap();
    }

    #[test]
    fn the_scan_measures_depth_paths_and_parts_without_recursing() {
        let s = scan(br#"{"a": [1, [2, {"b\"]": [[]]}]], "c": "}{", "d": {}}"#, 3);
        assert_eq!(s.deepest, 6);
        // The object that went past 3 levels is the second element of the second element
        // of "a"; the brackets inside a key or a string are text.
        assert_eq!(s.over.as_deref(), Some("a[1][1]"));
        let parts: Vec<(&str, usize)> = s.parts.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        assert_eq!(parts, [("a", 24), ("c", 4), ("d", 2)]);
        // A million brackets cost a counter: the stack stops at the limit.
        let deep = nested(1_000_000);
        let s = scan(deep.as_bytes(), 4);
        assert_eq!((s.deepest, s.over.as_deref()), (1_000_000, Some("[0][0][0][0]")));
        // Unbalanced or truncated text is measured as far as it goes.
        assert_eq!(scan(b"]]}{[", 64).deepest, 2);
        assert_eq!(scan(br#"{"a": "unterminated"#, 64).deepest, 1);
    }

    /// docs/sync-protocol.md states every budget with the constant's own value.
    #[test]
    fn the_budgets_table_of_the_protocol_doc_is_the_constants() {
        use crate::policy::defaults as d;
        let doc = include_str!("../../../docs/sync-protocol.md");
        let expected = [
            ("MAX_SNAPSHOT_BYTES", d::MAX_SNAPSHOT_BYTES),
            ("MAX_BODY_DEPTH", d::MAX_BODY_DEPTH),
            ("MAX_FLAG_VALUE_DEPTH", d::MAX_FLAG_VALUE_DEPTH),
            ("MAX_FLAG_VALUE_BYTES", d::MAX_FLAG_VALUE_BYTES),
            ("MAX_FLAGS", d::MAX_FLAGS),
            ("MAX_DEPENDENCIES", d::MAX_DEPENDENCIES),
            ("MAX_OPERATIONS", d::MAX_OPERATIONS),
            ("MAX_ROUTES", d::MAX_ROUTES),
            ("MAX_MATRIX_ROWS", d::MAX_MATRIX_ROWS),
            ("MAX_FAULTS", d::MAX_FAULTS),
            ("MAX_BREAKER_OVERRIDES", d::MAX_BREAKER_OVERRIDES),
            ("MAX_MESSAGE_BYTES", d::MAX_MESSAGE_BYTES),
        ];
        let rows: Vec<(String, String)> = doc
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let name = cells.get(2)?.strip_prefix('`')?.strip_suffix('`')?;
                let value = cells.get(3)?;
                name.starts_with("MAX_").then(|| (name.to_string(), value.to_string()))
            })
            .collect();
        assert_eq!(rows.len(), expected.len(), "{rows:?}");
        for (name, value) in expected {
            let row =
                rows.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} not in the table"));
            assert_eq!(row.1, value.to_string(), "{name}");
        }
    }

    /// A body that is not UTF-8 is malformed, not a panic and not "no rules".
    #[test]
    fn a_body_that_is_not_utf8_is_malformed() {
        assert!(matches!(accept(SCHEMA_VERSION, b"{\"flags\": \xff}"), Err(PolicyError::Malformed { .. })));
    }
}
