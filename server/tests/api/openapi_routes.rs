//! The OpenAPI document covers the API exactly: every route the router serves (read from
//! `src/api/mod.rs`, as `tests/architecture.rs` reads the source) is documented with the same
//! methods and nothing else is; every operation documents its errors as problem+json; the
//! security scheme is there and only login and the document itself need no token. The
//! served document is the generated one, and a request to each documented operation reaches
//! a handler (never the router's 404 or 405).

use std::collections::BTreeSet;

use levee_server::api::ApiDoc;
use reqwest::StatusCode;
use utoipa::OpenApi;

use crate::helpers::TestApp;

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// (METHOD, /api/v1 path) of every `.route(...)` in the API router's source.
fn router_routes() -> BTreeSet<(String, String)> {
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/api/mod.rs")).unwrap();
    let mut out = BTreeSet::new();
    let mut rest = src.as_str();
    while let Some(i) = rest.find(".route(") {
        rest = &rest[i + ".route(".len()..];
        // The call's text up to its closing parenthesis.
        let mut depth = 1;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                depth += match c {
                    '(' => 1,
                    ')' => -1,
                    _ => 0,
                };
                depth == 0
            })
            .map(|(i, _)| i)
            .unwrap();
        let call = &rest[..end];
        let path = call.split('"').nth(1).unwrap();
        for m in METHODS {
            let used = call.match_indices(&format!("{m}(")).any(|(i, _)| {
                i == 0 || !call.as_bytes()[i - 1].is_ascii_alphanumeric() && call.as_bytes()[i - 1] != b'_'
            });
            if used {
                out.insert((m.to_uppercase(), format!("/api/v1{path}")));
            }
        }
    }
    out
}

fn document() -> serde_json::Value {
    serde_json::to_value(ApiDoc::openapi()).unwrap()
}

fn documented(doc: &serde_json::Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for m in METHODS {
            if item.get(m).is_some() {
                out.insert((m.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

#[test]
fn openapi_document_covers_every_route_and_nothing_else() {
    let routes = router_routes();
    assert!(routes.len() > 30, "the router's source was read: {routes:?}");
    let doc = documented(&document());
    let missing: Vec<_> = routes.difference(&doc).collect();
    let extra: Vec<_> = doc.difference(&routes).collect();
    assert!(missing.is_empty(), "routes missing from the OpenAPI document: {missing:?}");
    assert!(extra.is_empty(), "documented operations the router does not serve: {extra:?}");
}

#[test]
fn openapi_every_error_is_problem_json_and_the_security_scheme_is_documented() {
    let doc = document();
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer", "{}", doc["components"]);
    assert_eq!(doc["security"][0]["bearer"], serde_json::json!([]));
    for (path, item) in doc["paths"].as_object().unwrap() {
        for m in METHODS {
            let Some(op) = item.get(m) else { continue };
            let public = ["/api/v1/auth/login", "/api/v1/openapi.json"].contains(&path.as_str());
            let responses = op["responses"].as_object().unwrap();
            let mut needed = vec!["400"];
            if public {
                assert_eq!(op["security"], serde_json::json!([]), "{m} {path} needs no token");
            } else {
                let security = op.get("security").cloned().unwrap_or_else(|| doc["security"].clone());
                assert_eq!(
                    security,
                    serde_json::json!([{"bearer": []}]),
                    "{m} {path} needs the bearer token"
                );
                needed.extend(["401", "403"]);
            }
            if path.contains('{') {
                needed.push("404");
            }
            if op.get("requestBody").is_some() {
                needed.extend(["413", "415", "422"]);
            }
            for status in needed {
                assert!(responses.contains_key(status), "{m} {path} does not document {status}");
            }
            for (status, r) in responses {
                if status.as_str() >= "400" {
                    let content = r["content"].as_object().unwrap_or_else(|| panic!("{m} {path} {status}"));
                    assert_eq!(
                        content.keys().collect::<Vec<_>>(),
                        vec!["application/problem+json"],
                        "{m} {path} {status}"
                    );
                    assert_eq!(
                        content["application/problem+json"]["schema"]["$ref"],
                        "#/components/schemas/Problem"
                    );
                }
            }
        }
    }
}

/// Each documented operation, sent with its documented path examples and no body, reaches
/// a handler: the router never answers "no such API resource" nor 405.
#[tokio::test]
async fn openapi_served_document_is_the_generated_one_and_every_operation_is_routed() {
    let app = TestApp::spawn().await;
    let served: serde_json::Value =
        app.client.get(app.url("/api/v1/openapi.json")).send().await.unwrap().json().await.unwrap();
    assert_eq!(served, document());
    for (method, path) in documented(&served) {
        let concrete = path
            .replace("{env}", "prod")
            .replace("{svc}", "checkout")
            .replace("{key}", "beta")
            .replace("{dep}", "payments")
            .replace("{rev}", "1")
            .replace("{id}", "x")
            .replace("{username}", "nobody");
        let (s, _, b) = app
            .call_as(
                "not-a-token",
                reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                &concrete,
                None,
                &[],
            )
            .await;
        assert_ne!(s, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}: {b}");
        assert!(
            !(s == StatusCode::NOT_FOUND && b["detail"] == "no such API resource"),
            "{method} {path} is not routed: {b}"
        );
    }
}

/// Every default the document states is a value the server reads: a duration's default is
/// written as a duration (`"15s"`), never as the `{"secs": …, "nanos": …}` object serde
/// would make of the Rust type (which the server refuses).
#[test]
fn defaults_are_written_as_the_server_reads_them() {
    fn walk(v: &serde_json::Value, path: &str, bad: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(d) = m.get("default") {
                    let text = d.to_string();
                    if text.contains("\"secs\"") || text.contains("\"nanos\"") {
                        bad.push(format!("{path}: {text}"));
                    }
                }
                for (k, child) in m {
                    walk(child, &format!("{path}/{k}"), bad);
                }
            }
            serde_json::Value::Array(a) => {
                for (i, child) in a.iter().enumerate() {
                    walk(child, &format!("{path}/{i}"), bad);
                }
            }
            _ => {}
        }
    }
    let doc = document();
    let mut bad = Vec::new();
    walk(&doc, "", &mut bad);
    assert!(bad.is_empty(), "{} defaults in serde's Duration shape:\n{}", bad.len(), bad.join("\n"));
    let schemas = &doc["components"]["schemas"];
    for (component, field, want) in [
        ("CircuitBreaker", "wait_in_open", "15s"),
        ("Dependency", "fallback_timeout", "50ms"),
        ("Bulkhead", "max_wait", "0s"),
    ] {
        let d = &schemas[component]["properties"][field]["default"];
        assert_eq!(d, want, "{component}.{field}");
        levee_agent::policy::duration::parse(want).unwrap();
    }
}

/// Where serde refuses fields a body does not name (`deny_unknown_fields` on a tagged enum),
/// the document says so: a body the document allows is one the server reads. An experiment's
/// probe with an extra key, or an extra field in its body, is refused by both.
#[test]
fn closed_tagged_enums_are_closed_in_the_document() {
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    for name in ["FaultAction", "Window", "Probe", "BlastRadius"] {
        let variants = schemas[name]["oneOf"].as_array().unwrap_or_else(|| panic!("{name} is a oneOf"));
        for v in variants {
            assert_eq!(v["additionalProperties"], serde_json::json!(false), "{name}: {v}");
        }
    }
    let success_rate = schemas["Probe"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| v["properties"].get("success_rate"))
        .expect("a success_rate variant");
    assert_eq!(success_rate["additionalProperties"], serde_json::json!(false), "{success_rate}");
}
