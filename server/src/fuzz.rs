//! Fuzz target bodies, shared by the stable test (`tests/fuzz.rs`: a seed corpus plus seeded
//! random inputs, run in CI) and the cargo-fuzz crate in `fuzz/` (nightly, coverage-guided).
//! Each takes arbitrary bytes and must return without panicking, in bounded time and
//! memory, whatever they hold; errors are fine, they are the point.

use levee_agent::policy::{ServiceConfig, decode_config, decode_json, lint};
use prost::Message;

use crate::import::{ImportOptions, Source};

/// A fuzz target's body: any bytes in, no panic and no hang out.
pub type Target = fn(&[u8]);

/// Fuzz targets by name, as the cargo-fuzz crate names its binaries.
pub const TARGETS: &[(&str, Target)] = &[
    ("policy_decode_validate", policy_decode_validate),
    ("snapshot_decode", snapshot_decode),
    ("import_resilience4j", |d| import(Source::Resilience4j, d)),
    ("import_envoy", |d| import(Source::Envoy, d)),
    ("import_istio", |d| import(Source::Istio, d)),
    ("import_sentinel", |d| import(Source::Sentinel, d)),
    ("import_hystrix", |d| import(Source::Hystrix, d)),
    ("headers", headers),
    ("apply_yaml", apply_yaml),
];

/// A service configuration as the API and the agent decode it (strict JSON), then its
/// validation and lints; a valid one survives canonical encoding and decoding unchanged.
pub fn policy_decode_validate(data: &[u8]) {
    if let Ok(cfg) = decode_json::<ServiceConfig>(data) {
        let valid = cfg.validate().is_ok();
        let _ = lint(&cfg.policy);
        if valid {
            let again =
                decode_config(&levee_agent::policy::canonical_json(&cfg)).expect("canonical JSON decodes");
            assert_eq!(again, cfg, "canonical JSON round trip");
        }
    }
    let _ = levee_agent::policy::decode_policy(data);
}

/// A server message off the wire (protobuf), and the body of a snapshot in it as the agent
/// decodes it before applying; also the bytes as a snapshot body directly.
pub fn snapshot_decode(data: &[u8]) {
    use levee_agent::proto::{AgentMessage, ServerMessage, server_message};
    if let Ok(ServerMessage { kind: Some(server_message::Kind::Snapshot(s)) }) = ServerMessage::decode(data) {
        let _ = decode_config(&s.body);
        let _ = levee_agent::policy::content_hash(&s.body) == s.hash;
    }
    let _ = AgentMessage::decode(data);
    let _ = decode_config(data);
}

/// An importer on a file of any content.
pub fn import(source: Source, data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for name in ["fuzz.yaml", "fuzz.properties", "fuzz.json"] {
        let _ = crate::import::import(source, name, &text, &ImportOptions::default());
    }
}

/// The inbound deadline and criticality headers.
pub fn headers(data: &[u8]) {
    use levee_agent::deadline::{parse_criticality, parse_deadline_ms, parse_grpc_timeout};
    let _ = parse_grpc_timeout(data);
    let _ = parse_deadline_ms(data);
    let _ = parse_criticality(data);
}

/// The YAML (or JSON) manifests of `levee apply`; what parses writes back and parses again
/// to the same manifests.
pub fn apply_yaml(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(manifests) = crate::manifest::parse("fuzz.yaml", &text) {
        let yaml = crate::manifest::to_yaml(&manifests);
        let again = crate::manifest::parse("again.yaml", &yaml).expect("written YAML parses");
        assert_eq!(again.len(), manifests.len());
    }
}
