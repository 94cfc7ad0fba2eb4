use std::time::Duration;

use levee_agent::policy::{DependencyPolicy, FlagType, StalePolicy, Window};

use super::*;

const TWO_SERVICES: &str = "\
api_version: levee/v1
environment: prod
service: checkout
description: Takes orders
policy:
  default_deadline: 800ms
  dependencies:
    pricing:
      attempt_timeout: 300ms
      retry: { max_attempts: 2, base: 50ms, cap: 500ms }
      circuit_breaker:
        window: { type: time, seconds: 10 }
        failure_rate_threshold: 0.5
flags:
  pricing.enabled: { type: bool, value: true, description: kill switch }
  banner: { type: string, value: 'yes', stale: { revert_after: 1h } }
---
api_version: levee/v1
environment: prod
service: search
policy: {}
";

fn problem(text: &str) -> Problem {
    let err = parse("svc.yaml", text).unwrap_err();
    assert_eq!(err.problems.len(), 1, "{err}");
    err.problems[0].clone()
}

#[test]
fn decodes_every_document_of_a_multi_document_file() {
    let ms = parse("svc.yaml", TWO_SERVICES).unwrap();
    assert_eq!(ms.len(), 2);
    assert_eq!(ms[0].key(), "prod/checkout");
    assert_eq!(ms[0].policy.default_deadline, Duration::from_millis(800));
    let pricing = &ms[0].policy.dependencies["pricing"];
    assert_eq!(pricing.attempt_timeout, Duration::from_millis(300));
    assert_eq!(pricing.retry.max_attempts, 2);
    assert_eq!(pricing.circuit_breaker.window, Window::Time { seconds: 10 });
    // Strict booleans: 'yes' stays the string the flag's type says.
    assert_eq!(ms[0].flags["banner"].kind, FlagType::String);
    assert_eq!(ms[0].flags["banner"].value, serde_json::json!("yes"));
    assert_eq!(ms[0].flags["banner"].stale, StalePolicy::RevertAfter(Duration::from_secs(3600)));
    assert_eq!(ms[1].key(), "prod/search");
    assert_eq!(ms[1].policy, Policy::default());
}

#[test]
fn yaml_round_trip_gives_back_the_same_services() {
    let ms = parse("svc.yaml", TWO_SERVICES).unwrap();
    let yaml = to_yaml(&ms);
    assert_eq!(yaml.matches("\n---\n").count(), 1, "{yaml}");
    assert_eq!(parse("again.yaml", &yaml).unwrap(), ms);
}

#[test]
fn json_round_trip_for_one_service_and_for_several() {
    let ms = parse("svc.yaml", TWO_SERVICES).unwrap();
    let one = to_json(&ms[..1]);
    assert!(one.trim_start().starts_with('{'), "{one}");
    assert_eq!(parse("one.json", &one).unwrap(), ms[..1]);
    let both = to_json(&ms);
    assert!(both.trim_start().starts_with('['), "{both}");
    assert_eq!(parse("both.json", &both).unwrap(), ms);
}

#[test]
fn a_sequence_document_holds_several_services() {
    let text = "- {api_version: levee/v1, environment: a, service: x, policy: {}}\n\
                - {api_version: levee/v1, environment: a, service: y, policy: {}}\n";
    let ms = parse("list.yaml", text).unwrap();
    assert_eq!(ms.iter().map(ServiceManifest::key).collect::<Vec<_>>(), ["a/x", "a/y"]);
}

#[test]
fn unknown_fields_are_refused_with_their_path_line_and_document() {
    let text = TWO_SERVICES
        .replace("      attempt_timeout: 300ms\n", "      attempt_timeout: 300ms\n      timeout: 1s\n");
    let p = problem(&text);
    assert_eq!(p.path, "policy.dependencies.pricing.timeout");
    assert!(p.message.contains("unknown field `timeout`"), "{p:?}");
    assert_eq!(p.document, 1);
    assert_eq!(p.line, Some(10));
    let err = parse("svc.yaml", &text).unwrap_err().to_string();
    assert!(err.starts_with("svc.yaml:10:"), "{err}");
    assert!(
        err.contains("document 1 (prod/checkout): policy.dependencies.pricing.timeout: unknown field"),
        "{err}"
    );
}

#[test]
fn errors_in_a_later_document_name_that_document() {
    let text = TWO_SERVICES.replace("service: search\n", "service: search\nowner: me\n");
    let p = problem(&text);
    assert_eq!(p.document, 2, "{p:?}");
    assert!(p.message.contains("unknown field `owner`"), "{p:?}");
}

#[test]
fn wrong_types_name_the_path() {
    let text = TWO_SERVICES.replace("max_attempts: 2", "max_attempts: lots");
    let p = problem(&text);
    assert_eq!(p.path, "policy.dependencies.pricing.retry.max_attempts");
}

#[test]
fn a_sequence_where_a_mapping_belongs_is_refused() {
    let text =
        TWO_SERVICES.replace("      retry: { max_attempts: 2, base: 50ms, cap: 500ms }", "      retry: []");
    let p = problem(&text);
    assert_eq!(p.path, "policy.dependencies.pricing.retry");
}

#[test]
fn yaml_1_1_booleans_are_not_booleans() {
    let text = TWO_SERVICES.replace("value: true, description", "value: on, description");
    let err = parse("svc.yaml", &text).unwrap_err();
    let p = &err.problems[0];
    assert_eq!(p.path, "flags.pricing.enabled.value");
    assert!(p.message.contains("must be a bool value"), "{err}");
}

#[test]
fn duplicate_keys_are_refused() {
    let text = TWO_SERVICES
        .replace("  default_deadline: 800ms\n", "  default_deadline: 800ms\n  default_deadline: 900ms\n");
    let p = problem(&text);
    assert!(p.message.contains("duplicate"), "{p:?}");
    assert_eq!(p.line, Some(7));
    // The path names the duplicated key and the message says the rule in YAML's words (not
    // the decoder's); the file's other problems are reported beside it.
    assert_eq!(p.path, "policy.default_deadline");
    assert_eq!(p.message, "duplicate key `default_deadline`: a key may appear only once in a mapping");
    let err = parse("svc.yaml", &text.replace("max_attempts: 2", "max_attempts: 20")).unwrap_err();
    let paths: Vec<&str> = err.problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(paths, ["policy.default_deadline", "policy.dependencies.pricing.retry.max_attempts"], "{err}");
}

/// A wrong type first does not hide the duplicate keys further down, nor one duplicate key
/// another: every duplicate key of every document is a problem of its own, at its later
/// occurrence, and none is listed twice.
#[test]
fn every_duplicate_key_of_every_document_is_reported_once() {
    let text = TWO_SERVICES
        .replace("  default_deadline: 800ms\n", "  default_deadline: 800ms\n  default_deadline: 900ms\n")
        .replace(
            "failure_rate_threshold: 0.5\n",
            "failure_rate_threshold: 0.5\n        failure_rate_threshold: 0.6\n",
        )
        .replace("policy: {}\n", "policy: {}\nservice: search\n");
    let err = parse("svc.yaml", &text).unwrap_err();
    let found: Vec<(usize, &str, Option<u64>)> =
        err.problems.iter().map(|p| (p.document, p.path.as_str(), p.line)).collect();
    assert_eq!(
        found,
        [
            (1, "policy.default_deadline", Some(7)),
            (1, "policy.dependencies.pricing.circuit_breaker.failure_rate_threshold", Some(15)),
            (2, "service", Some(24)),
        ],
        "{err}"
    );
    for p in &err.problems {
        assert!(!p.path.contains('?'), "{err}");
        assert!(p.message.starts_with("duplicate key `"), "{err}");
        assert!(p.message.ends_with("`: a key may appear only once in a mapping"), "{err}");
        assert!(p.column.is_some(), "{err}");
    }
    assert_eq!(
        err.problems[1].message,
        "duplicate key `failure_rate_threshold`: a key may appear only once in a mapping"
    );
    let services: Vec<Option<&str>> = err.problems.iter().map(|p| p.service.as_deref()).collect();
    assert_eq!(services, [Some("prod/checkout"), Some("prod/checkout"), Some("prod/search")], "{err}");
    let shown = err.to_string();
    assert!(shown.contains("svc.yaml:15:9: document 1 (prod/checkout): policy.dependencies.pricing.circuit_breaker.failure_rate_threshold: duplicate key"), "{shown}");

    // A wrong type comes first in the file: it is still the first problem, and the
    // duplicate keys after it follow, each once.
    let text = TWO_SERVICES
        .replace("max_attempts: 2", "max_attempts: -1")
        .replace(
            "failure_rate_threshold: 0.5\n",
            "failure_rate_threshold: 0.5\n        failure_rate_threshold: 0.6\n",
        )
        .replace("policy: {}\n", "policy: {}\nservice: search\n");
    let err = parse("svc.yaml", &text).unwrap_err();
    let found: Vec<(usize, &str, Option<u64>)> =
        err.problems.iter().map(|p| (p.document, p.path.as_str(), p.line)).collect();
    assert_eq!(
        found,
        [
            (1, "policy.dependencies.pricing.retry.max_attempts", Some(10)),
            (1, "policy.dependencies.pricing.circuit_breaker.failure_rate_threshold", Some(14)),
            (2, "service", Some(23)),
        ],
        "{err}"
    );
    assert!(err.problems[0].message.contains("must be between 1 and 10"), "{err}");
    assert_eq!(err.problems[2].service.as_deref(), Some("prod/search"), "{err}");
}

#[test]
fn missing_and_wrong_api_version_are_refused() {
    let p = problem("environment: prod\nservice: x\npolicy: {}\n");
    assert!(p.message.contains("missing field `api_version`"), "{p:?}");
    let p = problem("api_version: levee/v2\nenvironment: prod\nservice: x\npolicy: {}\n");
    assert_eq!(p.path, "api_version");
    assert!(p.message.contains("levee/v1"), "{p:?}");
}

#[test]
fn out_of_range_values_are_reported_with_path_and_allowed_range() {
    let text = TWO_SERVICES
        .replace("max_attempts: 2", "max_attempts: 12")
        .replace("failure_rate_threshold: 0.5", "failure_rate_threshold: 50")
        .replace("service: search", "service: Search");
    let err = parse("svc.yaml", &text).unwrap_err();
    let paths: Vec<_> = err.problems.iter().map(|p| (p.document, p.path.as_str())).collect();
    assert_eq!(
        paths,
        [
            (1, "policy.dependencies.pricing.retry.max_attempts"),
            (1, "policy.dependencies.pricing.circuit_breaker.failure_rate_threshold"),
            (2, "service"),
        ]
    );
    let text = err.to_string();
    // Each is located at its value in the file, not only the first decoding error.
    assert!(text.contains("svc.yaml:10:30: document 1 (prod/checkout): policy.dependencies.pricing.retry.max_attempts: must be between 1 and 10 (got 12)"), "{text}");
    assert!(text.contains("svc.yaml:20:10: document 2 (prod/Search): service: "), "{text}");
    assert!(text.contains("must be a ratio, 0 < x <= 1 (got 50)"), "{text}");
}

#[test]
fn the_same_service_twice_is_refused() {
    let text = format!(
        "{TWO_SERVICES}---\napi_version: levee/v1\nenvironment: prod\nservice: checkout\npolicy: {{}}\n"
    );
    let p = problem(&text);
    assert_eq!(p.document, 3);
    assert!(p.message.contains("twice"), "{p:?}");
}

#[test]
fn an_empty_file_holds_no_service() {
    let p = problem("# nothing here\n---\n");
    assert!(p.message.contains("no service"), "{p:?}");
}

#[test]
fn syntax_errors_carry_the_location() {
    let p = problem("api_version: levee/v1\nenvironment: [prod\n");
    assert!(p.line.is_some(), "{p:?}");
    // The path ends at what it names: no `?` for the part the parser never reached.
    let p = problem(
        "api_version: levee/v1\nenvironment: prod\nservice: x\npolicy:\n  dependencies:\n    db: [1\n",
    );
    assert!(p.line.is_some(), "{p:?}");
    assert_eq!(p.path, "policy.dependencies.db", "{p:?}");
}

#[test]
fn a_long_description_is_refused() {
    let mut m = ServiceManifest::new("prod", "x");
    m.description = "d".repeat(MAX_DESCRIPTION_BYTES + 1);
    let e = m.validate().unwrap_err();
    assert_eq!(e.0[0].path, "description");
    m.description = "ok".into();
    m.policy.dependencies.insert("db".into(), DependencyPolicy::default());
    m.validate().unwrap();
}

/// `max_attempts: -1` is a decoding error, not a range check, yet it names the range (not
/// "invalid u32") and keeps its line and column; every other problem of every document
/// follows it instead of being hidden.
#[test]
fn a_wrong_type_names_the_range_and_every_other_problem_follows() {
    let text = "\
api_version: levee/v1
environment: prod
service: checkout
policy:
  dependencies:
    pricing:
      retry: { max_attempts: -1 }
      bulkhead: { max_concurrent: 2.5 }
      circuit_breaker: { minimum_calls: 0 }
---
api_version: levee/v1
environment: prod
service: search
policy:
  default_deadline: 0s
  colour: blue
";
    let err = parse("svc.yaml", text).unwrap_err();
    let first = &err.problems[0];
    assert_eq!(first.path, "policy.dependencies.pricing.retry.max_attempts");
    assert_eq!((first.document, first.line), (1, Some(7)));
    assert_eq!(first.service.as_deref(), Some("prod/checkout"));
    assert!(first.message.contains("expected a whole number; must be between 1 and 10"), "{err}");
    let rest: Vec<(usize, &str)> = err.problems[1..].iter().map(|p| (p.document, p.path.as_str())).collect();
    assert_eq!(
        rest,
        [
            (1, "policy.dependencies.pricing.bulkhead.max_concurrent"),
            (1, "policy.dependencies.pricing.circuit_breaker.minimum_calls"),
            // In file order; a field left out (reserve, a consequence of the deadline
            // below) is located at the mapping that leaves it out.
            (2, "policy.reserve"),
            (2, "policy.default_deadline"),
            (2, "policy.colour"),
        ],
        "{err}"
    );
    assert!(err.problems[1].message.contains("must be between 1 and"), "{err}");
    assert!(err.problems[1].message.ends_with("(got 2.5)"), "{err}");
    assert_eq!(err.problems[3].service.as_deref(), Some("prod/search"));
    let lines: Vec<Option<u64>> = err.problems.iter().map(|p| p.line).collect();
    assert_eq!(lines, [Some(7), Some(8), Some(9), Some(15), Some(15), Some(16)], "{err}");
    // The text a user reads names the file, the line and the range.
    let shown = err.to_string();
    assert!(shown.starts_with("svc.yaml:7:"), "{shown}");
}
