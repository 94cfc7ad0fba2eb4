//! Spring Boot configuration as resilience4j and Hystrix (Spring Cloud Netflix, Archaius)
//! files use it: YAML or `.properties`, both read as Spring does — flattened to dotted
//! keys (`resilience4j.retry.instances.a.maxAttempts`), keys compared with relaxed binding
//! (`maxAttempts` = `max-attempts` = `max_attempts`), `${VAR:default}` placeholders
//! resolved to their default (and reported), lists kept as one setting.

use super::ImportError;
use super::doc::{self, Node, Seg, leaves, path_text};
use super::plan::{Plan, Sid};

/// One Spring property.
#[derive(Clone, Debug)]
pub struct Prop {
    /// Its setting in the report.
    pub sid: Sid,
    /// Key segments as written: `resilience4j`, `retry`, `instances`, `backendA`,
    /// `retryExceptions`, and `[0]` for a list index.
    pub keys: Vec<String>,
    /// The value with placeholders resolved; `None` when a placeholder has no default.
    pub value: Option<String>,
    /// The value as parsed.
    pub node: Node,
}

impl Prop {
    /// The key segment `i` in relaxed form (`max-attempts` → `maxattempts`).
    pub fn canon(&self, i: usize) -> String {
        self.keys.get(i).map(|k| canon(k)).unwrap_or_default()
    }

    /// The segments from `i` on, relaxed and joined by `.`.
    pub fn canon_from(&self, i: usize) -> String {
        self.keys.iter().skip(i).map(|k| canon(k)).collect::<Vec<_>>().join(".")
    }
}

/// Handles `spring.application.name` (the service name when the user gives none);
/// returns whether `pr` was it.
pub fn application_name(plan: &mut Plan, pr: &Prop) -> bool {
    if pr.canon_from(0) != "spring.application.name" {
        return false;
    }
    if let Some(v) = &pr.value {
        plan.suggest_service(v);
    }
    plan.not_mapped(
        pr.sid,
        "names the application: used as the manifest's service when --service is not given",
    );
    true
}

/// Spring's relaxed binding: case, `-` and `_` do not matter in property names.
pub fn canon(key: &str) -> String {
    key.chars().filter(|c| *c != '-' && *c != '_').flat_map(char::to_lowercase).collect()
}

fn split_key(out: &mut Vec<String>, key: &str) {
    for part in key.split('.') {
        let mut rest = part;
        while let Some(i) = rest.find('[') {
            if i > 0 {
                out.push(rest[..i].to_string());
            }
            let end = rest[i..].find(']').map_or(rest.len(), |e| i + e + 1);
            out.push(rest[i..end].to_string());
            rest = &rest[end..];
        }
        if !rest.is_empty() {
            out.push(rest.to_string());
        }
    }
}

/// Reads a Spring configuration file (YAML, or `.properties` when it looks like one) and
/// registers every property as a setting of `plan`.
pub fn read(plan: &mut Plan, text: &str) -> Result<Vec<Prop>, ImportError> {
    let mut props = Vec::new();
    if doc::looks_like_properties(text) {
        for (k, v) in doc::parse_properties(text)? {
            let sid = plan.setting(0, &k, &v);
            let mut keys = Vec::new();
            split_key(&mut keys, &k);
            props.push(Prop { sid, keys, value: None, node: Node::Str(v) });
        }
    } else {
        let docs = doc::parse_yaml(text)?;
        plan.set_documents(docs.len());
        if docs.len() > 1 {
            plan.general_note(
                "the file has several YAML documents: they are read in order and a later one overrides an \
                 earlier one; Spring profiles (spring.config.activate.on-profile) are not evaluated",
            );
        }
        for (i, d) in docs.iter().enumerate() {
            for leaf in leaves(d) {
                let sid = plan.setting(i, &path_text(&leaf.path), &leaf.node.text());
                let mut keys = Vec::new();
                for seg in &leaf.path {
                    match seg {
                        Seg::Key(k) => split_key(&mut keys, k),
                        Seg::Index(n) => keys.push(format!("[{n}]")),
                    }
                }
                props.push(Prop { sid, keys, value: None, node: leaf.node });
            }
        }
    }
    for p in &mut props {
        let raw = p.node.text();
        match resolve(&raw) {
            Ok((value, notes)) => {
                for n in notes {
                    plan.note(p.sid, n);
                }
                p.value = Some(value);
            }
            Err(reason) => plan.not_mapped(p.sid, reason),
        }
    }
    Ok(props)
}

/// Resolves `${NAME:default}` placeholders (nested ones too) to their defaults. Returns the
/// text and one note per placeholder; fails when a placeholder has no default.
pub fn resolve(text: &str) -> Result<(String, Vec<String>), String> {
    let mut notes = Vec::new();
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let body_start = start + 2;
        let mut depth = 1;
        let mut end = None;
        let bytes = rest.as_bytes();
        let mut i = body_start;
        while i < bytes.len() {
            if bytes[i] == b'$' && bytes.get(i + 1) == Some(&b'{') {
                depth += 1;
                i += 2;
                continue;
            }
            if bytes[i] == b'}' {
                depth -= 1;
                if depth == 0 {
                    end = Some(i);
                    break;
                }
            }
            i += 1;
        }
        let Some(end) = end else {
            return Err(format!("unterminated placeholder in {text:?}"));
        };
        let body = &rest[body_start..end];
        let (name, default) = split_placeholder(body);
        match default {
            Some(d) => {
                let (value, inner) = resolve(d)?;
                notes.extend(inner);
                notes.push(format!(
                    "placeholder ${{{name}}} is set at run time; its default {value:?} was imported"
                ));
                out.push_str(&value);
            }
            None => {
                return Err(format!(
                    "the value comes from ${{{name}}} at run time and the file gives no default to import"
                ));
            }
        }
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Ok((out, notes))
}

/// `NAME:default` → (`NAME`, `Some(default)`); the `:` of a nested placeholder does not
/// count.
fn split_placeholder(body: &str) -> (&str, Option<&str>) {
    let mut depth = 0;
    let bytes = body.as_bytes();
    for i in 0..bytes.len() {
        match bytes[i] {
            b'{' => depth += 1,
            b'}' => depth -= 1,
            b':' if depth == 0 => return (&body[..i], Some(&body[i + 1..])),
            _ => {}
        }
    }
    (body, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_take_their_default_and_say_so() {
        let (v, notes) = resolve("${FINERACT_RETRY_MAX_ATTEMPTS:3}").unwrap();
        assert_eq!(v, "3");
        assert!(notes[0].contains("${FINERACT_RETRY_MAX_ATTEMPTS}"), "{notes:?}");
        assert_eq!(resolve("${A:${B:1s}}").unwrap().0, "1s");
        assert_eq!(resolve("${U:http://localhost:9001}/books").unwrap().0, "http://localhost:9001/books");
        assert_eq!(resolve("${X:a,b}").unwrap().0, "a,b");
        assert_eq!(resolve("plain").unwrap(), ("plain".to_string(), vec![]));
        assert!(resolve("${NO_DEFAULT}").unwrap_err().contains("no default"));
    }

    #[test]
    fn relaxed_keys_and_list_indices() {
        assert_eq!(canon("max-attempts"), canon("maxAttempts"));
        assert_eq!(canon("max_attempts"), "maxattempts");
        let mut keys = Vec::new();
        split_key(&mut keys, "resilience4j.retry.instances.a.recordExceptions[0]");
        assert_eq!(keys, ["resilience4j", "retry", "instances", "a", "recordExceptions", "[0]"]);
    }
}
