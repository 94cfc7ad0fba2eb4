//! What agents send is untrusted (SEC-2), and a revoked token ends its streams (SEC-3).

// The server log buffer below is a std Mutex: filled by one task, read by the test, never
// held across an await.
#![allow(clippy::disallowed_types)]

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use levee_agent::proto::{AgentMessage, BreakerStatus, FeatureStatus, Nack, StatusReport, agent_message};
use levee_server::auth::{Door, Keys};
use levee_server::db::Role;
use reqwest::Method;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_stream::StreamExt;
use tonic::Code;

use crate::control_plane::open;
use crate::helpers::{JWT_SECRET, TestApp};
use crate::support::{Api, agent, levee_serve, wait_until};

/// The forged log line of the issue: a NACK whose text holds a newline and fake fields.
const FORGED: &str = "2026-12-01T08:00:00.000000Z  INFO flag changed from the UI actor=admin flag=payments.enabled value=false";

/// SEC-2: an agent reports a NACK, breaker states, a source and names holding newlines and
/// fake log fields. The real server's log (the `levee` binary's stdout) keeps it on the
/// NACK's own line as an escaped, quoted field; the API and the UI show it as the agent's
/// text (escaped), never as a line of their own or a state the server vouches for; an
/// instance id outside its alphabet is refused at `Hello`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sec_2_foreign_text_in_logs_stays_data() {
    let data = tempfile::tempdir().unwrap();
    let mut child = levee_serve(data.path(), "127.0.0.1:0", "127.0.0.1:0", "info")
        .env("LEVEE_JWT_SECRET", JWT_SECRET)
        .stderr(Stdio::null())
        .spawn()
        .expect("levee binary starts");
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (http, grpc) = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(l) = lines.next_line().await.unwrap() {
            if let Some(rest) = l.strip_prefix("levee listening: http://") {
                let http = rest.split_whitespace().next().unwrap().to_string();
                let grpc =
                    rest.split("grpc://").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
                return (http, grpc);
            }
        }
        panic!("levee exited before listening");
    })
    .await
    .expect("levee prints its addresses");
    let sink = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(l)) = lines.next_line().await {
            sink.lock().unwrap().push(l);
        }
    });
    let base = format!("http://{http}");
    let grpc = format!("http://{grpc}");
    let api = Api::login(&base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;

    // An instance id with a newline is refused before anything is stored or logged.
    let err = open(&grpc, &token, "prod", "checkout", "pod-1\nINFO forged", 0).await.err().expect("refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("instance_id"), "{err}");

    let mut raw = open(&grpc, &token, "prod", "checkout", "pod-1", 0).await.unwrap();
    let snap = raw.next_snapshot(Duration::from_secs(10)).await.expect("initial snapshot");
    let detail = format!("bad policy\n{FORGED}\r\n\u{1b}[31mred\u{202e}");
    raw.tx
        .send(AgentMessage {
            kind: Some(agent_message::Kind::Nack(Nack {
                service: "checkout".into(),
                revision: snap.revision,
                nonce: snap.nonce,
                error_detail: detail.clone(),
            })),
        })
        .await
        .unwrap();
    raw.tx
        .send(AgentMessage {
            kind: Some(agent_message::Kind::Status(StatusReport {
                service: "checkout".into(),
                // It refused the snapshot, so it still runs what it had: nothing.
                applied_revision: 0,
                source: "live (verified by the server)".into(),
                breakers: vec![BreakerStatus {
                    dependency: "payments\nINFO breaker closed by admin".into(),
                    state: "CLOSED_BY_ADMIN".into(),
                    last_transition_reason: format!("x\n{FORGED}"),
                    ..BreakerStatus::default()
                }],
                features: vec![FeatureStatus {
                    feature: "<script>alert(1)</script>".into(),
                    level: "HEALTHY (server checked)".into(),
                    degraded_since_ms: 1,
                }],
                ..StatusReport::default()
            })),
        })
        .await
        .unwrap();

    // The real log: one line for the NACK, the text escaped inside a quoted field.
    wait_until("the NACK in the server log", Duration::from_secs(10), || {
        log.lock().unwrap().iter().any(|l| l.contains("agent rejected a snapshot"))
    })
    .await;
    let logged = log.lock().unwrap().clone();
    let nack_line = logged.iter().find(|l| l.contains("agent rejected a snapshot")).unwrap();
    assert!(nack_line.contains(r#"detail="bad policy\\n2026-12-01T08:00:00"#), "{nack_line}");
    assert!(!nack_line.contains('\x1b') && !nack_line.contains('\u{202e}'), "{nack_line:?}");
    for l in &logged {
        assert!(
            !l.starts_with("2026-12-01T08:00:00")
                && (l == nack_line || !l.contains("flag changed from the UI")),
            "a line of the log came from the agent: {l:?}\nwhole log: {logged:#?}"
        );
    }

    // The API shows the agent's text escaped, and no state the server does not know.
    let nacks = "/environments/prod/services/checkout/nacks";
    let mut shown = serde_json::Value::Null;
    for _ in 0..500 {
        shown = api.send(Method::GET, nacks, None).await;
        if !shown.as_array().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stored = shown[0]["error_detail"].as_str().unwrap();
    assert!(stored.starts_with("bad policy\\n2026-12-01T08:00:00"), "{stored}");
    assert!(stored.ends_with("\\r\\n\\u{1b}[31mred\\u{202e}"), "{stored}");
    let agents_path = "/environments/prod/services/checkout/agents";
    let mut agents = serde_json::Value::Null;
    for _ in 0..500 {
        agents = api.send(Method::GET, agents_path, None).await;
        if agents[0]["status"]["breakers"].as_array().is_some_and(|b| !b.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = &agents[0]["status"];
    assert_eq!(status["source"], "UNRECOGNIZED", "{agents}");
    assert_eq!(status["breakers"][0]["state"], "UNRECOGNIZED");
    assert_eq!(status["breakers"][0]["dependency"], "payments\\nINFO breaker closed by admin");
    assert_eq!(status["features"][0]["level"], "UNRECOGNIZED");

    // The UI: the agent's words as escaped data, labelled as the agent's.
    let (ui, _) =
        Keys::new(JWT_SECRET.as_bytes()).unwrap().session("admin", Role::Admin, 0, Door::Ui).unwrap();
    let page = reqwest::Client::new()
        .get(format!("{base}/ui/environments/prod/services/checkout"))
        .header("cookie", format!("levee_session={ui}"))
        .send()
        .await
        .unwrap();
    assert!(page.status().is_success(), "{}", page.status());
    let html = page.text().await.unwrap();
    assert!(html.contains("bad policy\\n2026-12-01T08:00:00"), "NACK text shown escaped");
    assert!(!html.contains("<script>alert(1)</script>"), "agent text is never markup");
    assert!(!html.contains("CLOSED_BY_ADMIN") && !html.contains("verified by the server"), "{html}");
    assert!(html.contains("the server has not verified it"), "agent-reported columns are labelled");
    child.kill().await.unwrap();
}

/// SEC-3: an agent token is revoked while a real agent's stream is open: the stream ends
/// within seconds (not at the next reconnect), and the agent cannot come back with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sec_3_revoked_token_ends_open_streams_within_seconds() {
    let app = TestApp::spawn().await;
    let api = Api::login(&app.base).await;
    api.seed().await;
    let minted = api
        .send(
            Method::POST,
            "/tokens",
            Some(serde_json::json!({"kind": "agent", "name": "sec3", "environment": "prod",
                "services": ["checkout"], "reason": "e2e"})),
        )
        .await;
    let (token, id) = (minted["token"].as_str().unwrap(), minted["id"].as_str().unwrap());
    let cache = tempfile::tempdir().unwrap();
    let real = agent(&app.grpc, token, cache.path());
    real.wait_for_initial_sync(Duration::from_secs(10)).await.expect("first sync");

    // A hand-driven stream too, to see how it ends.
    let mut raw = open(&app.grpc, token, "prod", "checkout", "raw-sec3", 0).await.unwrap();
    raw.next_snapshot(Duration::from_secs(5)).await.expect("initial snapshot");
    let both =
        poll_connected(&api, Duration::from_secs(5), |c| c.len() == 2 && c.iter().all(|(_, on)| *on)).await;
    assert!(both.iter().any(|(i, _)| i == real.instance_id()), "{both:?}");

    let revoked_at = tokio::time::Instant::now();
    api.send(Method::DELETE, &format!("/tokens/{id}?reason=leaked"), None).await;
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match raw.rx.next().await {
                Some(Ok(_)) => continue,
                Some(Err(status)) => return Some(status),
                None => return None,
            }
        }
    })
    .await
    .expect("the open stream ends within seconds");
    let status = ended.expect("ended with a status");
    assert_eq!(status.code(), Code::Unauthenticated, "{status}");
    assert!(status.message().contains("revoked"), "{status}");
    // The real agent's stream ended too, and its reconnects are refused.
    poll_connected(&api, Duration::from_secs(5), |c| c.iter().all(|(_, on)| !*on)).await;
    assert!(revoked_at.elapsed() < Duration::from_secs(5), "took {:?}", revoked_at.elapsed());
    let again = open(&app.grpc, token, "prod", "checkout", "raw-sec3", 0).await.err().expect("refused");
    assert_eq!(again.code(), Code::Unauthenticated);
}

/// Polls the fleet API until `cond` holds on (instance, connected) pairs; panics after
/// `timeout`.
async fn poll_connected(
    api: &Api,
    timeout: Duration,
    cond: impl Fn(&[(String, bool)]) -> bool,
) -> Vec<(String, bool)> {
    let start = tokio::time::Instant::now();
    loop {
        let v = api.send(Method::GET, "/environments/prod/services/checkout/agents", None).await;
        let c: Vec<(String, bool)> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|a| (a["instance_id"].as_str().unwrap().to_string(), a["connected"].as_bool().unwrap()))
            .collect();
        if cond(&c) {
            return c;
        }
        assert!(start.elapsed() < timeout, "timed out: agents are {c:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `levee serve` with `extra` environment; returns the child and the HTTP base URL.
async fn serve_bin(data: &std::path::Path, extra: &[(&str, &str)]) -> (tokio::process::Child, String) {
    let mut cmd = levee_serve(data, "127.0.0.1:0", "127.0.0.1:0", "warn");
    cmd.stderr(Stdio::null());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("levee binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let http = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(l) = lines.next_line().await.unwrap() {
            if let Some(rest) = l.strip_prefix("levee listening: http://") {
                return rest.split_whitespace().next().unwrap().to_string();
            }
        }
        panic!("levee exited before listening");
    })
    .await
    .expect("levee prints its addresses");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, format!("http://{http}"))
}

async fn login_status(base: &str, password: &str) -> (reqwest::StatusCode, Option<String>) {
    let res = reqwest::Client::new()
        .post(format!("{base}/api/v1/auth/login"))
        .json(&serde_json::json!({"username": "admin", "password": password}))
        .send()
        .await
        .unwrap();
    let status = res.status();
    let token =
        res.json::<serde_json::Value>().await.ok().and_then(|v| v["token"].as_str().map(String::from));
    (status, token)
}

/// The bootstrap password applies at the first start only: `levee users set admin` changes
/// it (audited, ending admin's open sessions) and a restart with the same
/// `LEVEE_ADMIN_PASSWORD` (as compose and Kubernetes pass it) does not put the old one back;
/// `LEVEE_RESET_ADMIN_PASSWORD=true` does, when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_password_only_on_first_start_and_users_set_survives_restarts() {
    use crate::helpers::ADMIN_PASSWORD;
    const NEW: &str = "the-new-admin-password";
    let data = tempfile::tempdir().unwrap();
    let (mut first, base) = serve_bin(data.path(), &[]).await;
    let (s, session) = login_status(&base, ADMIN_PASSWORD).await;
    assert_eq!(s, 200);
    let session = session.unwrap();

    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_levee"))
        .args(["users", "set", "admin", "--role", "admin", "--reason", "rotate the bootstrap password"])
        .env("LEVEE_DATA_DIR", data.path())
        .env("LEVEE_USER_PASSWORD", NEW)
        .env("USER", "ops")
        .env_remove("LEVEE_DATABASE_URL")
        .env_remove("LEVEE_ADMIN_PASSWORD")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("sessions have ended"));
    // The session opened before the change is over.
    let res = reqwest::Client::new()
        .get(format!("{base}/api/v1/environments"))
        .bearer_auth(&session)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    first.kill().await.unwrap();

    // Restarted with the same LEVEE_ADMIN_PASSWORD: the new password stays.
    let (mut second, base) = serve_bin(data.path(), &[]).await;
    assert_eq!(login_status(&base, ADMIN_PASSWORD).await.0, 401, "the old password came back");
    let (s, token) = login_status(&base, NEW).await;
    assert_eq!(s, 200);
    let audit: serde_json::Value = reqwest::Client::new()
        .get(format!("{base}/api/v1/audit"))
        .bearer_auth(token.unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let row = audit.as_array().unwrap().iter().find(|r| r["action"] == "user.update").expect("audited");
    assert_eq!((row["actor"].as_str(), row["via"].as_str()), (Some("local:ops"), Some("local")), "{row}");
    assert_eq!(row["reason"], "rotate the bootstrap password");
    assert_eq!(row["after"]["password_changed"], true);
    second.kill().await.unwrap();

    // Asked explicitly, the start sets it again (audited too).
    let (mut third, base) = serve_bin(data.path(), &[("LEVEE_RESET_ADMIN_PASSWORD", "true")]).await;
    assert_eq!(login_status(&base, ADMIN_PASSWORD).await.0, 200);
    assert_eq!(login_status(&base, NEW).await.0, 401);
    third.kill().await.unwrap();
}
