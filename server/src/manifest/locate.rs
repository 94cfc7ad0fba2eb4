//! Where each value of a YAML document is written, so that problems found in decoded data
//! (validation errors, the problems after the first decoding error) carry a line and a
//! column like the decoder's own first error does.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// One value of a document and where it starts.
#[derive(Debug)]
pub(super) struct Located {
    line: u64,
    column: u64,
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Scalar,
    /// Every entry as written, a repeated key included (the file is read with
    /// `DuplicateKeyPolicy::PassThrough`), with the place of its key.
    Map(Vec<(String, (u64, u64), Located)>),
    Seq(Vec<Located>),
}

impl<'de> Deserialize<'de> for Located {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Spanned::<Inner>::deserialize(d)?;
        Ok(Located { line: s.referenced.line(), column: s.referenced.column(), inner: s.value })
    }
}

/// A mapping key of any scalar type, as text.
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a scalar key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Key, E> {
                Ok(Key(String::new()))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Inner {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Inner;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Inner, E> {
                Ok(Inner::Scalar)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Inner, E> {
                Ok(Inner::Scalar)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Inner, E> {
                Ok(Inner::Scalar)
            }
            fn visit_i128<E: de::Error>(self, _: i128) -> Result<Inner, E> {
                Ok(Inner::Scalar)
            }
            fn visit_u128<E: de::Error>(self, _: u128) -> Result<Inner, E> {
                Ok(Inner::Scalar)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Inner, E> {
                Ok(Inner::Scalar)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Inner, E> {
                Ok(Inner::Scalar)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Inner, E> {
                Ok(Inner::Scalar)
            }
            fn visit_none<E: de::Error>(self) -> Result<Inner, E> {
                Ok(Inner::Scalar)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Inner, D::Error> {
                Inner::deserialize(d)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Inner, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = map.next_key::<Spanned<Key>>()? {
                    let at = (k.referenced.line(), k.referenced.column());
                    out.push((k.value.0, at, map.next_value::<Located>()?));
                }
                Ok(Inner::Map(out))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Inner, A::Error> {
                let mut out = Vec::new();
                while let Some(v) = seq.next_element::<Located>()? {
                    out.push(v);
                }
                Ok(Inner::Seq(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl Located {
    /// The items of a document written as a sequence of services, or the document itself.
    pub(super) fn items(self) -> Vec<Located> {
        match self.inner {
            Inner::Seq(items) => items,
            inner => vec![Located { inner, ..self }],
        }
    }

    /// Line and column (from 1) of the value at `path` (`policy.dependencies.pricing.retry`,
    /// `faults[0].action`; keys may hold dots, as flag keys do), or of the deepest part of
    /// it the document writes (a field left out is located at its mapping).
    pub(super) fn find(&self, path: &str) -> (u64, u64) {
        let mut node = self;
        let mut rest = path;
        loop {
            if rest.is_empty() || rest == "." {
                return (node.line, node.column);
            }
            let next = match &node.inner {
                Inner::Map(entries) => entries
                    .iter()
                    .filter(|(k, _, _)| {
                        !k.is_empty()
                            && rest
                                .strip_prefix(k.as_str())
                                .is_some_and(|r| r.is_empty() || r.starts_with('.') || r.starts_with('['))
                    })
                    // A repeated key: the later value, the one the decoded data keeps.
                    .max_by_key(|(k, _, _)| k.len())
                    .map(|(k, _, v)| (v, &rest[k.len()..])),
                Inner::Seq(items) => rest.strip_prefix('[').and_then(|r| {
                    let (i, r) = r.split_once(']')?;
                    Some((items.get(i.parse::<usize>().ok()?)?, r))
                }),
                Inner::Scalar => None,
            };
            match next {
                Some((child, r)) => {
                    node = child;
                    rest = r.strip_prefix('.').unwrap_or(r);
                }
                None => return (node.line, node.column),
            }
        }
    }

    /// Every key written again in the same mapping, in file order: its path (as
    /// [`Self::find`] reads it), the key, and the line and column of the later occurrence.
    pub(super) fn duplicates(&self) -> Vec<(String, String, u64, u64)> {
        let mut out = Vec::new();
        self.collect_duplicates("", &mut out);
        out.sort_by_key(|d| (d.2, d.3));
        out
    }

    fn collect_duplicates(&self, path: &str, out: &mut Vec<(String, String, u64, u64)>) {
        match &self.inner {
            Inner::Map(entries) => {
                for (i, (k, (line, column), v)) in entries.iter().enumerate() {
                    let here = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                    if entries[..i].iter().any(|(earlier, _, _)| earlier == k) {
                        out.push((here.clone(), k.clone(), *line, *column));
                    }
                    v.collect_duplicates(&here, out);
                }
            }
            Inner::Seq(items) => {
                for (i, v) in items.iter().enumerate() {
                    v.collect_duplicates(&format!("{path}[{i}]"), out);
                }
            }
            Inner::Scalar => {}
        }
    }
}
