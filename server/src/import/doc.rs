//! Source files as trees with keys in file order, and their settings (leaves).
//!
//! YAML (one or more documents), JSON (comments allowed, as Sentinel's files have them) and
//! Java `.properties` are all read into [`Node`]s. A *setting* is a leaf of that tree: a
//! scalar, an empty mapping or sequence, or a sequence of scalars (one setting, e.g. a
//! list of exception classes). Every setting gets exactly one line in the report.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use super::ImportError;
use super::plan::Plan;

/// A value of a source file; mappings keep their keys in file order.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// `~`, `null`, or an empty value.
    Null,
    /// `true` / `false` (and YAML 1.1 spellings such as `on`, as Spring reads them).
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A number with a fraction or beyond `i64`.
    Float(f64),
    /// A string.
    Str(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, keys in file order.
    Map(Vec<(String, Node)>),
}

impl Node {
    /// The value under `key` of a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The entries of a mapping (empty for anything else).
    pub fn entries(&self) -> &[(String, Node)] {
        match self {
            Node::Map(m) => m,
            _ => &[],
        }
    }

    /// The items of a sequence (empty for anything else).
    pub fn items(&self) -> &[Node] {
        match self {
            Node::Seq(s) => s,
            _ => &[],
        }
    }

    /// The string of a string scalar.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }

    /// A number (integer or float, or a string holding one).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Node::Int(i) => Some(*i as f64),
            Node::Float(f) => Some(*f),
            Node::Str(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    /// A boolean (or a string `true` / `false`).
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Node::Bool(b) => Some(*b),
            Node::Str(s) if s.eq_ignore_ascii_case("true") => Some(true),
            Node::Str(s) if s.eq_ignore_ascii_case("false") => Some(false),
            _ => None,
        }
    }

    fn is_scalar(&self) -> bool {
        !matches!(self, Node::Seq(_) | Node::Map(_))
    }

    /// The value as the report shows it: scalars as written, collections inline.
    pub fn text(&self) -> String {
        match self {
            Node::Null => "null".into(),
            Node::Bool(b) => b.to_string(),
            Node::Int(i) => i.to_string(),
            Node::Float(f) => {
                if f.fract() == 0.0 && f.abs() < 1e15 {
                    format!("{f:.1}")
                } else {
                    f.to_string()
                }
            }
            Node::Str(s) => s.clone(),
            Node::Seq(items) => {
                let inner: Vec<String> = items.iter().map(Node::text).collect();
                format!("[{}]", inner.join(", "))
            }
            Node::Map(entries) => {
                let inner: Vec<String> = entries.iter().map(|(k, v)| format!("{k}: {}", v.text())).collect();
                format!("{{{}}}", inner.join(", "))
            }
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any YAML or JSON value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
                Ok(Node::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
                Ok(Node::Int(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
                Ok(i64::try_from(v).map_or(Node::Float(v as f64), Node::Int))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
                Ok(Node::Float(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Node, E> {
                Ok(Node::Str(v.to_string()))
            }
            fn visit_string<E>(self, v: String) -> Result<Node, E> {
                Ok(Node::Str(v))
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Node, D2::Error> {
                Node::deserialize(d)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut out = Vec::new();
                while let Some(v) = seq.next_element()? {
                    out.push(v);
                }
                Ok(Node::Seq(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut out: Vec<(String, Node)> = Vec::new();
                while let Some(key) = map.next_key::<Node>()? {
                    let key = match key {
                        Node::Seq(_) | Node::Map(_) => {
                            return Err(de::Error::custom("a mapping key must be a scalar"));
                        }
                        k => k.text(),
                    };
                    let value = map.next_value()?;
                    if out.iter().any(|(k, _)| *k == key) {
                        return Err(de::Error::custom(format!("duplicate key {key:?}")));
                    }
                    out.push((key, value));
                }
                Ok(Node::Map(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// One step of a path inside a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    /// A mapping key, as written (it may contain dots, as Spring keys do).
    Key(String),
    /// A sequence index from 0.
    Index(usize),
}

/// Renders a path the way people write it: `a.b[0].c`.
pub fn path_text(path: &[Seg]) -> String {
    let mut out = String::new();
    for s in path {
        match s {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    if out.is_empty() { ".".into() } else { out }
}

/// A leaf of a document.
#[derive(Clone, Debug)]
pub struct Leaf {
    /// Where it is.
    pub path: Vec<Seg>,
    /// Its value.
    pub node: Node,
}

/// Every setting of `node`, depth first, in file order.
pub fn leaves(node: &Node) -> Vec<Leaf> {
    let mut out = Vec::new();
    walk(node, &mut Vec::new(), &mut out);
    out
}

fn walk(node: &Node, path: &mut Vec<Seg>, out: &mut Vec<Leaf>) {
    match node {
        Node::Map(entries) if !entries.is_empty() => {
            for (k, v) in entries {
                path.push(Seg::Key(k.clone()));
                walk(v, path, out);
                path.pop();
            }
        }
        Node::Seq(items) if !items.is_empty() && !items.iter().all(Node::is_scalar) => {
            for (i, v) in items.iter().enumerate() {
                path.push(Seg::Index(i));
                walk(v, path, out);
                path.pop();
            }
        }
        _ => out.push(Leaf { path: path.clone(), node: node.clone() }),
    }
}

/// Registers every setting of `docs` in the plan (document `i` is `docs[i]`).
pub fn register(plan: &mut Plan, docs: &[Node]) {
    plan.set_documents(docs.len());
    for (i, d) in docs.iter().enumerate() {
        for leaf in leaves(d) {
            plan.setting(i, &path_text(&leaf.path), &leaf.node.text());
        }
    }
}

/// Reads every YAML document of `text` (empty documents are skipped). JSON is YAML too.
/// Only `true` / `false` are booleans: `on`, `y` or `no` stay the text they are, so the
/// report shows values as written and each importer reads booleans as its source does.
pub fn parse_yaml(text: &str) -> Result<Vec<Node>, ImportError> {
    let options = serde_saphyr::options! { strict_booleans: true };
    serde_saphyr::from_multiple_with_options::<Node>(text, options)
        .map_err(|e| ImportError::Syntax { format: "YAML", message: e.without_snippet().to_string() })
}

/// Reads JSON that may carry `/* */` and `//` comments (Sentinel's own files start with a
/// licence comment, which Sentinel's parser accepts).
pub fn parse_json_with_comments(text: &str) -> Result<Node, ImportError> {
    let stripped = json_comments::StripComments::new(text.as_bytes());
    serde_json::from_reader(stripped)
        .map_err(|e| ImportError::Syntax { format: "JSON", message: e.to_string() })
}

/// Reads a Java `.properties` file (UTF-8): key/value pairs in file order. Keys and values
/// are unescaped; continuation lines are joined.
pub fn parse_properties(text: &str) -> Result<Vec<(String, String)>, ImportError> {
    let mut out = Vec::new();
    java_properties::PropertiesIter::new_with_encoding(text.as_bytes(), encoding_rs::UTF_8)
        .read_into(|k, v| out.push((k, v)))
        .map_err(|e| ImportError::Syntax { format: ".properties", message: e.to_string() })?;
    Ok(out)
}

/// Whether the text looks like a `.properties` file rather than YAML: its first setting
/// line has `key=value` with no `: ` before the `=`.
pub fn looks_like_properties(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('!') && l != &"---")
        .is_some_and(|l| match (l.find('='), l.find(": ")) {
            (Some(eq), Some(colon)) => eq < colon,
            (Some(_), None) => !l.ends_with(':'),
            _ => false,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_file_order_and_lists_of_scalars_are_one_setting() {
        let docs = parse_yaml("b: 1\na:\n  list: [x, y]\n  items:\n    - {k: 1}\n  empty: {}\n").unwrap();
        let l = leaves(&docs[0]);
        let paths: Vec<String> = l.iter().map(|l| path_text(&l.path)).collect();
        assert_eq!(paths, ["b", "a.list", "a.items[0].k", "a.empty"]);
        assert_eq!(l[1].node.text(), "[x, y]");
    }

    #[test]
    fn empty_documents_are_skipped_and_duplicates_refused() {
        assert_eq!(parse_yaml("a: 1\n---\n---\nb: 2\n---\n").unwrap().len(), 2);
        assert!(parse_yaml("a: 1\na: 2\n").is_err());
    }

    #[test]
    fn json_comments_are_accepted() {
        let n = parse_json_with_comments("/**\n * licence\n */\n[{\"count\": 20.0}] // tail").unwrap();
        assert_eq!(n.items()[0].get("count"), Some(&Node::Float(20.0)));
        assert_eq!(n.items()[0].get("count").unwrap().text(), "20.0");
    }

    #[test]
    fn properties_keep_order_and_unescape() {
        let p = parse_properties("# c\nb.x=1\na.y : two \\\n  lines\nc\\:d=3\n").unwrap();
        assert_eq!(
            p,
            [("b.x".into(), "1".into()), ("a.y".into(), "two lines".into()), ("c:d".into(), "3".into())]
        );
        assert!(looks_like_properties("# hi\nspring.a=b\n"));
        assert!(!looks_like_properties("spring:\n  a: b=c\n"));
        assert!(!looks_like_properties("a: x=y\n"));
    }
}
