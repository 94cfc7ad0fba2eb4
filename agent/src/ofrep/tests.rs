use std::sync::Arc;

use tokio::time::Instant;

use super::*;
use crate::applied::{Applied, Source};
use crate::flags::tests::apply;
use crate::policy::decode_config;

const FLAGS: &str = r#"{"flags":{
    "kill":{"type":"bool","value":false,"owner":"payments-team"},
    "limit":{"type":"int","value":7},
    "ratio":{"type":"float","value":0.25},
    "color":{"type":"string","value":"red"},
    "layout":{"type":"json","value":{"columns":3}},
    "gradual":{"type":"bool","value":true,"rollout":{"percent":50}},
    "everyone":{"type":"bool","value":true,"rollout":{"percent":100}}
}}"#;

fn agent() -> crate::Agent {
    let a = crate::Agent::builder("http://127.0.0.1:9", "t", "prod", "checkout").build().unwrap();
    apply(a.shared(), 4, FLAGS);
    a
}

fn ctx(key: Option<&str>) -> Context {
    Context { targeting_key: key.map(str::to_string), service: None }
}

fn value(e: &Evaluation) -> Option<&serde_json::Value> {
    match e {
        Evaluation::Success(s) => s.value.as_ref(),
        Evaluation::Failure(f) => panic!("{f:?}"),
    }
}

#[test]
fn requests_are_read_and_bad_ones_name_what_is_wrong() {
    assert_eq!(parse_request(br#"{"context":{"targetingKey":"u1","plan":"pro"}}"#).unwrap(), ctx(Some("u1")));
    assert_eq!(parse_request(b"{}").unwrap(), Context::default());
    assert_eq!(
        parse_request(br#"{"context":{"service":"checkout"}}"#).unwrap().service.as_deref(),
        Some("checkout")
    );
    let code = |body: &[u8]| parse_request(body).unwrap_err().error_code;
    assert_eq!(code(b"not json"), ErrorCode::ParseError);
    assert_eq!(code(b"[1]"), ErrorCode::ParseError);
    assert_eq!(code(br#"{"context":3}"#), ErrorCode::InvalidContext);
    assert_eq!(code(br#"{"context":{"targetingKey":5}}"#), ErrorCode::InvalidContext);
    let long = format!(r#"{{"context":{{"targetingKey":"{}"}}}}"#, "k".repeat(MAX_TARGETING_KEY_BYTES + 1));
    let e = parse_request(long.as_bytes()).unwrap_err();
    assert_eq!(e.error_code, ErrorCode::InvalidContext);
    assert!(e.error_details.contains("targetingKey") && e.error_details.contains("256"), "{e:?}");
    let many: serde_json::Map<_, _> =
        (0..=MAX_CONTEXT_FIELDS).map(|i| (format!("a{i}"), serde_json::Value::from(i))).collect();
    let body = serde_json::json!({ "context": many }).to_string();
    assert_eq!(code(body.as_bytes()), ErrorCode::InvalidContext);
    assert_eq!(code(&vec![b' '; MAX_REQUEST_BYTES + 1]), ErrorCode::ParseError);
}

#[tokio::test(start_paused = true)]
async fn every_type_answers_its_value_and_absent_flags_are_not_found() {
    let agent = agent();
    let c = ctx(None);
    assert_eq!(value(&agent.ofrep_evaluate("kill", &c)), Some(&serde_json::json!(false)));
    assert_eq!(value(&agent.ofrep_evaluate("limit", &c)), Some(&serde_json::json!(7)));
    assert_eq!(value(&agent.ofrep_evaluate("ratio", &c)), Some(&serde_json::json!(0.25)));
    assert_eq!(value(&agent.ofrep_evaluate("color", &c)), Some(&serde_json::json!("red")));
    assert_eq!(value(&agent.ofrep_evaluate("layout", &c)), Some(&serde_json::json!({"columns": 3})));
    let Evaluation::Success(s) = agent.ofrep_evaluate("kill", &c) else { panic!() };
    assert_eq!(s.reason, Reason::Static);
    assert_eq!(s.metadata.get("owner").map(String::as_str), Some("payments-team"));
    assert_eq!(s.metadata.get("type").map(String::as_str), Some("bool"));
    let Evaluation::Failure(f) = agent.ofrep_evaluate("missing", &c) else { panic!() };
    assert_eq!((f.key.as_deref(), f.error_code), (Some("missing"), ErrorCode::FlagNotFound));
    assert_eq!(ErrorCode::FlagNotFound.status(), 404);
}

/// A rollout answers as the handle does: inside gets the value, outside the caller's
/// default, and no key is a failure that says to send one.
#[tokio::test(start_paused = true)]
async fn rollouts_answer_as_the_handles_do() {
    let agent = agent();
    let handle = agent.flag_bool("gradual", false);
    let (mut inside, mut outside) = (0, 0);
    for i in 0..200 {
        let key = format!("user-{i}");
        match agent.ofrep_evaluate("gradual", &ctx(Some(&key))) {
            Evaluation::Success(Success { value: Some(v), reason: Reason::Split, .. }) => {
                assert_eq!(v, serde_json::json!(true));
                assert!(handle.get_for(&key), "{key}");
                inside += 1;
            }
            Evaluation::Success(Success { value: None, reason: Reason::Default, .. }) => {
                assert!(!handle.get_for(&key), "{key}");
                outside += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(inside > 50 && outside > 50, "{inside} / {outside}");
    let Evaluation::Failure(f) = agent.ofrep_evaluate("gradual", &ctx(None)) else { panic!() };
    assert_eq!(f.error_code, ErrorCode::TargetingKeyMissing);
    assert!(f.error_details.contains("targetingKey"), "{f:?}");
    assert_eq!(value(&agent.ofrep_evaluate("everyone", &ctx(None))), Some(&serde_json::json!(true)));
}

#[tokio::test(start_paused = true)]
async fn bulk_lists_every_set_flag_and_its_tag_changes_with_the_answer() {
    let agent = agent();
    let bulk = agent.ofrep_evaluate_all(&ctx(Some("user-1")));
    assert_eq!(bulk.flags.len(), 7);
    assert_eq!(bulk.metadata.get("revision").map(String::as_str), Some("4"));
    let (body, tag) = bulk.to_body();
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["flags"][0]["key"], "color");
    assert_eq!(agent.ofrep_evaluate_all(&ctx(Some("user-1"))).to_body().1, tag);
    assert!(etag_matches(&tag, &tag));
    assert!(etag_matches(&format!("W/{tag}, \"other\""), &tag));
    assert!(etag_matches("*", &tag));
    assert!(!etag_matches("\"other\"", &tag));

    apply(agent.shared(), 5, &FLAGS.replace(r#""value":false"#, r#""value":true"#));
    let (_, flipped) = agent.ofrep_evaluate_all(&ctx(Some("user-1"))).to_body();
    assert_ne!(flipped, tag);
}

/// An expired flag is not found, from the sidecar's agent and from a stored configuration
/// alike; a snapshot the server has not confirmed answers CACHED.
#[tokio::test(start_paused = true)]
async fn expiry_and_cached_snapshots() {
    let now = Timestamp::now();
    let past = Timestamp::from_unix_ms(now.unix_ms() - 1000).to_rfc3339();
    let body = format!(
        r#"{{"flags":{{"old":{{"type":"bool","value":false,"expires_at":"{past}"}},"on":{{"type":"bool","value":true}}}}}}"#
    );
    let config = decode_config(body.as_bytes()).unwrap();
    assert!(stored_flag(&config, "old", now).is_none());
    assert!(stored_flag(&config, "on", now).is_some());

    let agent = crate::Agent::builder("http://127.0.0.1:9", "t", "prod", "checkout").build().unwrap();
    agent.shared().install_live(Applied::new(
        config,
        3,
        crate::policy::content_hash(body.as_bytes()),
        Source::Cache,
        Some(Arc::from(body.as_str())),
        Instant::now(),
        now,
    ));
    let Evaluation::Failure(f) = agent.ofrep_evaluate("old", &ctx(None)) else { panic!() };
    assert_eq!(f.error_code, ErrorCode::FlagNotFound);
    let Evaluation::Success(s) = agent.ofrep_evaluate("on", &ctx(None)) else { panic!() };
    assert_eq!(s.reason, Reason::Cached);
    assert_eq!(agent.ofrep_evaluate_all(&ctx(None)).flags.len(), 1);
}
