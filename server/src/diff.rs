//! Structural diff of two JSON documents, for revision history.

use serde::Serialize;
use serde_json::Value;

/// One leaf that differs between two JSON documents.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DiffEntry {
    /// Dotted path (`policy.dependencies.pricing.attempt_timeout`, `faults[0]`).
    pub path: String,
    /// `added`, `removed` or `changed`.
    pub op: &'static str,
    /// Value before (absent when added).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    pub before: Option<Value>,
    /// Value after (absent when removed).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    pub after: Option<Value>,
}

/// Lists every leaf-level difference from `old` to `new`, in path order.
pub fn json_diff(old: &Value, new: &Value) -> Vec<DiffEntry> {
    let mut out = Vec::new();
    walk("", old, new, &mut out);
    out
}

fn child(prefix: &str, key: &str) -> String {
    if prefix.is_empty() { key.to_string() } else { format!("{prefix}.{key}") }
}

/// One key or index of both sides: walked into when both have it, else added or removed.
fn side(path: String, old: Option<&Value>, new: Option<&Value>, out: &mut Vec<DiffEntry>) {
    match (old, new) {
        (Some(x), Some(y)) => walk(&path, x, y, out),
        (Some(x), None) => out.push(DiffEntry { path, op: "removed", before: Some(x.clone()), after: None }),
        (None, Some(y)) => out.push(DiffEntry { path, op: "added", before: None, after: Some(y.clone()) }),
        (None, None) => {}
    }
}

fn walk(path: &str, old: &Value, new: &Value, out: &mut Vec<DiffEntry>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                side(child(path, k), a.get(k), b.get(k), out);
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                side(format!("{path}[{i}]"), a.get(i), b.get(i), out);
            }
        }
        (x, y) if x != y => out.push(DiffEntry {
            path: path.to_string(),
            op: "changed",
            before: Some(x.clone()),
            after: Some(y.clone()),
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reports_changed_added_and_removed_leaves() {
        let a = json!({"flags": {"x": {"value": true}, "gone": 1}, "list": [1, 2]});
        let b = json!({"flags": {"x": {"value": false}, "new": 2}, "list": [1]});
        let d = json_diff(&a, &b);
        let summary: Vec<(String, &str)> = d.iter().map(|e| (e.path.clone(), e.op)).collect();
        assert_eq!(
            summary,
            vec![
                ("flags.gone".to_string(), "removed"),
                ("flags.new".to_string(), "added"),
                ("flags.x.value".to_string(), "changed"),
                ("list[1]".to_string(), "removed"),
            ]
        );
    }
}
