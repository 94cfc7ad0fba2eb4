//! What the policy editor knows of a field besides its value, read from the policy model's
//! own schema (the one the API's OpenAPI document publishes, derived from the model's types
//! and doc comments): the values an enumeration takes, so the form offers a choice instead
//! of a free-text box, what the field means, in the model's words, and its name for people.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use levee_agent::policy::Policy;
use serde_json::Value;
use utoipa::{PartialSchema, ToSchema};

/// The policy's schema and every schema it refers to, by name, as JSON.
struct Model {
    root: Value,
    named: BTreeMap<String, Value>,
}

static MODEL: LazyLock<Model> = LazyLock::new(|| {
    let mut refs = Vec::new();
    <Policy as ToSchema>::schemas(&mut refs);
    let json = |s| serde_json::to_value(s).unwrap_or(Value::Null);
    Model {
        root: json(<Policy as PartialSchema>::schema()),
        named: refs.into_iter().map(|(name, s)| (name, json(s))).collect(),
    }
});

/// What the schema says of one field.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldInfo {
    /// The values an enumeration takes (empty: not an enumeration).
    pub choices: Vec<String>,
    /// What the field means (its doc comment in the model).
    pub help: String,
}

impl Model {
    /// The schema behind a `$ref`, and each branch of a `oneOf` / `anyOf` / `allOf`.
    fn expand<'a>(&'a self, node: &'a Value, out: &mut Vec<&'a Value>, depth: usize) {
        if depth > 16 {
            return;
        }
        if let Some(r) = node.get("$ref").and_then(Value::as_str) {
            if let Some(target) = r.rsplit('/').next().and_then(|n| self.named.get(n)) {
                self.expand(target, out, depth + 1);
            }
            return;
        }
        let mut branched = false;
        for key in ["oneOf", "anyOf", "allOf"] {
            for b in node.get(key).and_then(Value::as_array).into_iter().flatten() {
                branched = true;
                self.expand(b, out, depth + 1);
            }
        }
        if !branched || node.get("properties").is_some() || node.get("enum").is_some() {
            out.push(node);
        }
    }

    /// Every schema that may describe the value at `tokens` below `node`.
    /// The schemas are as written at the field (a `$ref` or `oneOf` unexpanded: its own
    /// description is the field's).
    fn at<'a>(&'a self, node: &'a Value, tokens: &[String]) -> Vec<&'a Value> {
        let Some((first, rest)) = tokens.split_first() else { return vec![node] };
        let mut here = Vec::new();
        self.expand(node, &mut here, 0);
        let mut out = Vec::new();
        for n in here {
            let next = n
                .get("properties")
                .and_then(|p| p.get(first))
                .or_else(|| n.get("additionalProperties").filter(|a| a.is_object()))
                .or_else(|| n.get("items").filter(|_| first.parse::<usize>().is_ok()));
            if let Some(next) = next {
                out.extend(self.at(next, rest));
            }
        }
        out
    }
}

fn tokens(pointer: &str) -> Vec<String> {
    pointer.split('/').skip(1).map(|t| t.replace("~1", "/").replace("~0", "~")).collect()
}

/// Whether the last token of the JSON `pointer` names a field of the model
/// (`/dependencies/payments/retry`), not an entry of a map whose keys the operator chose (a
/// dependency's name, an operation).
pub fn is_field(pointer: &str) -> bool {
    let tokens = tokens(pointer);
    let Some((last, parent)) = tokens.split_last() else { return false };
    let model = &*MODEL;
    let mut nodes = Vec::new();
    for n in model.at(&model.root, parent) {
        model.expand(n, &mut nodes, 0);
    }
    nodes.iter().any(|n| n.get("properties").and_then(|p| p.get(last)).is_some())
}

/// The variant of a tagged enumeration that one value of its tag names: the fields its
/// object has and those it requires.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Variant {
    pub fields: Vec<String>,
    pub required: Vec<String>,
}

/// When the field at JSON `pointer` is the tag that tells the variants of a tagged
/// enumeration apart (a breaker window's `type`: `count` with a `size`, `time` with
/// `seconds`), the variant `value` names; `None` for any other field.
pub fn variant(pointer: &str, value: &str) -> Option<Variant> {
    let tokens = tokens(pointer);
    let (tag, parent) = tokens.split_last()?;
    let model = &*MODEL;
    let mut nodes = Vec::new();
    for n in model.at(&model.root, parent) {
        model.expand(n, &mut nodes, 0);
    }
    let tagged: Vec<&Value> = nodes
        .into_iter()
        .filter(|n| n.get("properties").and_then(|p| p.get(tag)).and_then(|t| t.get("enum")).is_some())
        .collect();
    if tagged.len() < 2 {
        return None;
    }
    let names = |v: Option<&Value>| -> Vec<String> {
        match v {
            Some(Value::Object(m)) => m.keys().cloned().collect(),
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).map(str::to_string).collect(),
            _ => Vec::new(),
        }
    };
    let chosen = tagged.into_iter().find(|n| {
        n["properties"][tag]["enum"].as_array().is_some_and(|e| e.iter().any(|v| v.as_str() == Some(value)))
    })?;
    Some(Variant { fields: names(chosen.get("properties")), required: names(chosen.get("required")) })
}

/// A field's name for people: `max_attempts` reads `Max attempts`, an abbreviation as it
/// is written (`rtt_tolerance`: `RTT tolerance`).
pub fn label(name: &str) -> String {
    let words: Vec<String> = name
        .split('_')
        .filter(|w| !w.is_empty())
        .map(|w| match w {
            "rtt" => "RTT".to_string(),
            "lifo" => "LIFO".to_string(),
            "codel" => "CoDel".to_string(),
            "id" => "ID".to_string(),
            w => w.to_string(),
        })
        .collect();
    let text = words.join(" ");
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => name.to_string(),
    }
}

/// What the model's schema says of the policy field at JSON `pointer`
/// (`/dependencies/payments/criticality`).
pub fn field(pointer: &str) -> FieldInfo {
    let tokens = tokens(pointer);
    let model = &*MODEL;
    let raw = model.at(&model.root, &tokens);
    // An optional field's doc sits beside the `$ref` in its branch (`oneOf: [{$ref,
    // description}, {type: null}]`), where following the reference would lose it.
    let help = raw
        .iter()
        .find_map(|n| {
            n.get("description").and_then(Value::as_str).or_else(|| {
                ["oneOf", "anyOf", "allOf"]
                    .iter()
                    .flat_map(|k| n.get(*k).and_then(Value::as_array).into_iter().flatten())
                    .find_map(|b| b.get("description").and_then(Value::as_str))
            })
        })
        .unwrap_or_default();
    let mut info = FieldInfo { help: help.into(), ..FieldInfo::default() };
    let mut nodes = Vec::new();
    for n in raw {
        model.expand(n, &mut nodes, 0);
    }
    for n in &nodes {
        for v in n.get("enum").and_then(Value::as_array).into_iter().flatten() {
            if let Some(s) = v.as_str().filter(|s| !info.choices.iter().any(|c| c == s)) {
                info.choices.push(s.to_string());
            }
        }
        if info.help.is_empty()
            && let Some(d) = n.get("description").and_then(Value::as_str)
        {
            info.help = d.to_string();
        }
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enumerations_offer_the_values_the_model_takes() {
        assert_eq!(field("/dependencies/payments/criticality").choices, ["critical", "non_critical"]);
        let levels = field("/dependencies/payments/fallback").choices;
        assert!(
            levels.contains(&"generic".to_string()) && levels.contains(&"feature_error".to_string()),
            "{levels:?}"
        );
        let mode = field("/inbound/mode").choices;
        assert!(mode.contains(&"shadow".to_string()), "{mode:?}");
        assert!(
            field("/dependencies/payments/attempt_timeout").choices.is_empty(),
            "a duration is no enumeration"
        );
    }

    #[test]
    fn fields_read_as_words_and_names_stay_as_chosen() {
        assert_eq!(label("max_attempts"), "Max attempts");
        assert_eq!(label("rtt_tolerance"), "RTT tolerance");
        assert_eq!(label("codel_target"), "CoDel target");
        assert!(is_field("/dependencies/payments/retry"));
        assert!(is_field("/dependencies/payments/retry/max_attempts"));
        assert!(is_field("/inbound/limit"));
        assert!(!is_field("/dependencies/payments"), "a dependency's name is the operator's");
        assert!(!is_field("/dependencies/payments/operations/get_quote"), "so is an operation's");
    }

    #[test]
    fn a_tag_names_the_fields_of_its_variant() {
        let window = "/dependencies/payments/circuit_breaker/window/type";
        let time = variant(window, "time").expect("the window's type is a tag");
        assert!(time.fields.contains(&"seconds".to_string()) && !time.fields.contains(&"size".to_string()));
        assert!(time.required.contains(&"seconds".to_string()), "{time:?}");
        assert!(variant(window, "count").unwrap().fields.contains(&"size".to_string()));
        assert_eq!(variant(window, "hourly"), None, "no such variant");
        assert_eq!(variant("/dependencies/payments/criticality", "critical"), None, "a plain enumeration");
    }

    #[test]
    fn a_field_says_what_it_means() {
        let help = field("/dependencies/payments/enabled_flag").help;
        assert!(help.contains("bool flag"), "{help}");
        let optional = field("/dependencies/payments/circuit_breaker/max_wait_in_half_open").help;
        assert!(
            optional.contains("HALF_OPEN probe"),
            "an optional field's own doc, not its type's: {optional}"
        );
    }
}
