//! The rendered Kubernetes manifests keep the readiness promise: every overlay of
//! deploy/kubernetes, rendered with `kubectl kustomize`, probes paths and ports that answer
//! 200 on a live replica whose database is unreachable (so the pod stays in its Services
//! and keeps serving agents), while `/readyz` answers 503 there.
//!
//! Needs `kubectl` (its built-in kustomize): skipped without it unless
//! LEVEE_REQUIRE_KUBECTL is set (CI sets it), then it fails.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use levee_server::Server;
use levee_server::config::{Secret, Settings};
use serde_json::Value;

use crate::helpers::{ADMIN_PASSWORD, JWT_SECRET};
use crate::private_pg::PrivatePg;

const OVERLAYS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/overlays");

/// The Deployment's container of every overlay, rendered: overlay name → container.
fn rendered_containers() -> Option<BTreeMap<String, Value>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(OVERLAYS).unwrap() {
        let dir = entry.unwrap().path();
        let res = match std::process::Command::new("kubectl").arg("kustomize").arg(&dir).output() {
            Ok(r) => r,
            Err(e) => {
                assert!(
                    std::env::var("LEVEE_REQUIRE_KUBECTL").is_err(),
                    "LEVEE_REQUIRE_KUBECTL is set but kubectl does not run: {e}"
                );
                eprintln!("no kubectl: skipping the rendered-manifest probe test");
                return None;
            }
        };
        assert!(
            res.status.success(),
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&res.stderr)
        );
        let text = String::from_utf8(res.stdout).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("kustomize renders YAML");
        let deployment = docs.iter().find(|d| d["kind"] == "Deployment").expect("a Deployment");
        let container = deployment["spec"]["template"]["spec"]["containers"][0].clone();
        out.insert(dir.file_name().unwrap().to_string_lossy().into_owned(), container);
    }
    assert!(out.len() >= 2, "overlays found: {:?}", out.keys());
    Some(out)
}

/// The address of `server` that a probe on container port `port` (a name or a number)
/// reaches: the container's ports and its LEVEE_*_ADDR settings say which listener it is.
fn listener_of(container: &Value, port: &Value, server: &Server) -> SocketAddr {
    let number = match port {
        Value::String(name) => container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name.as_str())
            .unwrap_or_else(|| panic!("no container port named {name}"))["containerPort"]
            .as_u64()
            .unwrap(),
        other => other.as_u64().unwrap(),
    };
    let env: BTreeMap<&str, &str> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    let port_of = |var: &str| env.get(var).and_then(|a| a.rsplit(':').next()?.parse::<u64>().ok());
    if port_of("LEVEE_OPS_ADDR") == Some(number) {
        server.ops_addr.expect("the replica has an operations address")
    } else if port_of("LEVEE_HTTP_ADDR") == Some(number) {
        server.http_addr
    } else {
        panic!("probe port {number} is neither LEVEE_OPS_ADDR nor LEVEE_HTTP_ADDR: {env:?}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_readiness_probe_answers_200_while_the_database_is_unreachable() {
    let Some(containers) = rendered_containers() else { return };
    let Some(pg) = PrivatePg::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::for_dir(dir.path());
    settings.database_url = Secret::new(pg.url());
    settings.admin_password = Some(Secret::new(ADMIN_PASSWORD));
    settings.jwt_secret = Some(Secret::new(JWT_SECRET));
    settings.ops_addr = Some("127.0.0.1:0".parse().unwrap());
    let server = Server::start(settings, None).await.expect("replica starts");
    pg.stop();

    let client = reqwest::Client::new();
    for (overlay, container) in &containers {
        for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
            let get = &container[probe]["httpGet"];
            let path =
                get["path"].as_str().unwrap_or_else(|| panic!("{overlay}: {probe} has no httpGet path"));
            let addr = listener_of(container, &get["port"], &server);
            let res = client.get(format!("http://{addr}{path}")).send().await.unwrap();
            assert_eq!(
                res.status().as_u16(),
                200,
                "{overlay}: {probe} {path} on {addr} while the database is unreachable"
            );
        }
    }
    let res = client.get(format!("http://{}/readyz", server.http_addr)).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 503, "/readyz while the database is unreachable");
    server.shutdown().await;
}
