//! Kill switches from any language (docs/ofrep.md): OpenFeature programs in Rust, Node and
//! Python, with the standard OFREP providers (clients nobody here wrote), read a kill switch
//! from the `levee` binary and from `levee sidecar`, see a flip, keep the last value through
//! the sidecar with the server killed, and again after the sidecar restarts from its cache.
//! The sidecar as production runs it (a token file, several server addresses) fails over
//! past a dead address and follows a rotated token.
//!
//! The programs (`tests/clients/`: `rust/`, `ofrep_client.cjs`, `ofrep_client.py`) use what
//! `.ci/run` builds and installs (the Rust one into `target/ofrep-rust`, npm packages under
//! `target/ofrep-node`, a venv under `target/ofrep-venv`); without them their part is
//! skipped, unless LEVEE_REQUIRE_OFREP_CLIENTS is set (CI).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::support::{Api, BinServer};

const SWITCH: &str = "recommendations.enabled";
/// How long a client may take to see what the server or the sidecar answers now: the
/// target is 1 s from the server's answer (docs/benchmarks.md); this bounds the wait, it
/// does not measure it.
const PATIENCE: Duration = Duration::from_secs(10);

fn workspace_target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")
}

/// `levee sidecar` as a child process, and the address it serves OFREP on.
struct SidecarProcess {
    child: Child,
    base: String,
}

impl SidecarProcess {
    /// `levee sidecar` of prod/checkout on a free loopback port, named `e2e-sidecar`, with
    /// its cache in `cache`; the caller says where it syncs from and its token.
    fn command(cache: &Path) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_levee"));
        cmd.arg("sidecar")
            .args(["--environment", "prod", "--service", "checkout"])
            .args(["--listen", "127.0.0.1:0", "--instance-name", "e2e-sidecar"])
            .arg("--cache-dir")
            .arg(cache)
            .env_remove("LEVEE_SYNC_URL")
            .env_remove("LEVEE_AGENT_TOKEN")
            .env_remove("LEVEE_AGENT_TOKEN_FILE")
            .env("LEVEE_LOG", "warn");
        cmd
    }

    async fn start(grpc: &str, token: &str, cache: &Path) -> SidecarProcess {
        let mut cmd = Self::command(cache);
        cmd.args(["--server", grpc]).env("LEVEE_AGENT_TOKEN", token);
        Self::spawn(cmd).await
    }

    /// Runs `cmd` and waits for the address it prints.
    async fn spawn(mut cmd: Command) -> SidecarProcess {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("levee sidecar starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(l) = lines.next_line().await.unwrap() {
                if l.starts_with("levee sidecar listening:") {
                    return l;
                }
            }
            panic!("levee sidecar exited before listening");
        })
        .await
        .expect("levee sidecar prints its address");
        let addr = line.split("http://").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        SidecarProcess { child, base: format!("http://{addr}") }
    }

    async fn kill(mut self) {
        self.child.kill().await.expect("kill");
        let _ = self.child.wait().await;
    }
}

/// What a program read: the value, the reason (the Rust provider reports every answer as
/// STATIC, so only the Node and Python programs show Levee's), the error code (None when it
/// succeeded).
#[derive(Debug, PartialEq)]
struct Read {
    value: bool,
    reason: String,
    error: Option<String>,
}

/// An OpenFeature program reading a bool flag with its caller's default `true`: one JSON
/// line per `KEY DEFAULT` line.
struct Program {
    _child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Program {
    async fn start(mut cmd: Command, token: Option<&str>) -> Program {
        if let Some(t) = token {
            cmd.env("OFREP_TOKEN", t);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the client program starts");
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(PATIENCE, lines.next_line()).await.expect("ready in time").unwrap();
        assert!(
            ready.as_deref().is_some_and(|l| l.contains("ready")),
            "the program did not start: {ready:?}"
        );
        Program { _child: child, stdin, lines }
    }

    async fn read(&mut self) -> Read {
        self.stdin.write_all(format!("{SWITCH} true\n").as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
        let line = tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .expect("the program answers")
            .unwrap()
            .expect("the program is running");
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        Read {
            value: v["value"].as_bool().unwrap(),
            reason: v["reason"].as_str().unwrap_or_default().to_string(),
            error: v["errorCode"].as_str().map(str::to_string),
        }
    }

    /// Reads until the value is `want` without an error; panics after [`PATIENCE`].
    async fn until(&mut self, name: &str, want: bool) -> Read {
        let start = tokio::time::Instant::now();
        loop {
            let r = self.read().await;
            if r.value == want && r.error.is_none() {
                return r;
            }
            assert!(start.elapsed() < PATIENCE, "{name} still reads {r:?}, not {want}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn required() -> bool {
    std::env::var("LEVEE_REQUIRE_OFREP_CLIENTS").is_ok()
}

/// What is missing: skipped, or a failure when LEVEE_REQUIRE_OFREP_CLIENTS is set.
fn missing(what: &Path, language: &str) -> Option<Program> {
    assert!(!required(), "LEVEE_REQUIRE_OFREP_CLIENTS is set but {} is missing", what.display());
    eprintln!("{} missing: skipping the {language} OFREP client", what.display());
    None
}

/// The Rust program, when .ci/run built it.
async fn rust(base: &str, token: Option<&str>) -> Option<Program> {
    let bin = workspace_target().join("ofrep-rust/debug/ofrep-client");
    if !bin.exists() {
        return missing(&bin, "Rust");
    }
    let mut cmd = Command::new(bin);
    cmd.arg(base);
    Some(Program::start(cmd, token).await)
}

/// The Node program, when node and the packages are here.
async fn node(base: &str, token: Option<&str>) -> Option<Program> {
    let modules = workspace_target().join("ofrep-node/node_modules");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/ofrep_client.cjs");
    if !modules.join("@openfeature/ofrep-provider").exists() {
        return missing(&modules, "Node");
    }
    let mut cmd = Command::new("node");
    cmd.arg(script).arg(base).env("NODE_PATH", modules);
    Some(Program::start(cmd, token).await)
}

/// The Python program, when the venv is here.
async fn python(base: &str, token: Option<&str>) -> Option<Program> {
    let python = workspace_target().join("ofrep-venv/bin/python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/ofrep_client.py");
    if !python.exists() {
        return missing(&python, "Python");
    }
    let mut cmd = Command::new(python);
    cmd.arg(script).arg(base);
    Some(Program::start(cmd, token).await)
}

/// Every language's program against `base`.
async fn programs(base: &str, token: Option<&str>) -> Vec<(&'static str, Program)> {
    let mut out = Vec::new();
    out.extend(rust(base, token).await.map(|p| ("rust", p)));
    out.extend(node(base, token).await.map(|p| ("node", p)));
    out.extend(python(base, token).await.map(|p| ("python", p)));
    out
}

#[tokio::test]
async fn ofrep_clients_in_three_languages_read_kill_switches_through_the_sidecar_and_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("sidecar-cache");
    let server = BinServer::start(&dir.path().join("data"), "127.0.0.1:0", "127.0.0.1:0").await;
    let api = Api::login(&format!("http://{}", server.http)).await;
    api.seed().await;
    let agent_token = api.agent_token("prod", &["checkout"]).await;
    let flags = api
        .send(
            Method::POST,
            "/tokens",
            Some(json!({"kind": "flags", "name": "e2e-flags", "environment": "prod", "services": ["checkout"], "reason": "e2e"})),
        )
        .await;
    let flags_token = flags["token"].as_str().unwrap().to_string();

    let grpc = format!("http://{}", server.grpc);
    let sidecar = SidecarProcess::start(&grpc, &agent_token, &cache).await;
    let mut from_server = programs(&format!("http://{}/api/v1", server.http), Some(&flags_token)).await;
    let mut from_sidecar = programs(&sidecar.base, None).await;
    for (name, p) in from_server.iter_mut() {
        p.until(&format!("{name} from the server"), true).await;
    }
    for (name, p) in from_sidecar.iter_mut() {
        p.until(&format!("{name} from the sidecar"), true).await;
    }

    // A flip reaches every program, through the server and through the sidecar.
    let flipped = api.set_recommendations(false).await;
    for (name, p) in from_server.iter_mut() {
        let r = p.until(&format!("{name} from the server"), false).await;
        assert!(*name == "rust" || r.reason == "STATIC", "{name}: {r:?}");
    }
    for (name, p) in from_sidecar.iter_mut() {
        p.until(&format!("{name} from the sidecar"), false).await;
    }

    // The sidecar is in the fleet view like any agent, on the revision of the flip (the
    // fleet view is written in batches: wait for it).
    let start = tokio::time::Instant::now();
    loop {
        let agents = api.send(Method::GET, "/environments/prod/services/checkout/agents", None).await;
        let row = agents
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["instance_id"].as_str().is_some_and(|i| i.starts_with("e2e-sidecar-")))
            .cloned();
        if row.as_ref().is_some_and(|r| r["connected"] == true && r["applied_revision"] == flipped) {
            break;
        }
        assert!(start.elapsed() < PATIENCE, "the sidecar is not in the fleet view on {flipped}: {agents}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The server dies: the sidecar keeps the last value; the server's readers get their
    // caller's default with an error.
    server.kill().await;
    for (name, p) in from_sidecar.iter_mut() {
        let r = p.read().await;
        assert_eq!(
            (r.value, r.error.as_deref()),
            (false, None),
            "{name} from the sidecar with the server down"
        );
    }
    for (name, p) in from_server.iter_mut() {
        let r = p.read().await;
        assert!(r.value && r.error.is_some(), "{name} from the dead server: {r:?}");
    }

    // The sidecar restarts with the server still down: its cache answers, as CACHED.
    sidecar.kill().await;
    drop(from_sidecar);
    let sidecar = SidecarProcess::start(&grpc, &agent_token, &cache).await;
    for (name, mut p) in programs(&sidecar.base, None).await {
        let r = p.read().await;
        assert_eq!((r.value, r.error.as_deref()), (false, None), "{name} from the restarted sidecar");
        assert!(name == "rust" || r.reason == "CACHED", "{name} from the restarted sidecar: {r:?}");
    }
    sidecar.kill().await;
}

/// Reads the kill switch from the sidecar over OFREP until it is `want`; panics after
/// [`PATIENCE`] with the last answer.
async fn sidecar_reads(client: &reqwest::Client, base: &str, want: bool) {
    let start = tokio::time::Instant::now();
    loop {
        let res = client
            .post(format!("{base}/ofrep/v1/evaluate/flags/{SWITCH}"))
            .json(&json!({"context": {}}))
            .send()
            .await
            .expect("the sidecar answers");
        let status = res.status();
        let v: Value = res.json().await.unwrap_or(Value::Null);
        if status == 200 && v["value"] == want {
            return;
        }
        assert!(start.elapsed() < PATIENCE, "the sidecar still answers {status} {v}, not {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// When the server last counted the sidecar connected (ms), once it does.
async fn sidecar_connected_at(api: &Api) -> i64 {
    let start = tokio::time::Instant::now();
    loop {
        let agents = api.send(Method::GET, "/environments/prod/services/checkout/agents", None).await;
        let row = agents
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["instance_id"].as_str().is_some_and(|i| i.starts_with("e2e-sidecar-")))
            .cloned();
        if let Some(row) = row.filter(|r| r["connected"] == true) {
            let at = row["connected_at"].as_str().expect("connected_at");
            return levee_agent::policy::Timestamp::parse(at).unwrap().unix_ms();
        }
        assert!(start.elapsed() < PATIENCE, "the sidecar is not connected in the fleet view: {agents}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes a token as a mounted secret changes: a new file moved into place, so a reader
/// never sees half of it.
fn write_secret(path: &Path, token: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, format!("{token}\n")).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// `levee sidecar` as production runs it (docs/ofrep.md): its token in a file named by
/// `LEVEE_AGENT_TOKEN_FILE`, two addresses in `LEVEE_SYNC_URL` of which the first is dead.
/// It fails over to the live one and serves a flip; the token is rotated, the file
/// rewritten, the old token revoked, and the sidecar comes back with the file's token and
/// still serves flips.
#[tokio::test]
async fn the_sidecar_fails_over_to_a_live_address_and_follows_its_rotated_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let server = BinServer::start(&dir.path().join("data"), "127.0.0.1:0", "127.0.0.1:0").await;
    let api = Api::login(&format!("http://{}", server.http)).await;
    api.seed().await;
    let minted = api
        .send(
            Method::POST,
            "/tokens",
            Some(json!({"kind": "agent", "name": "checkout-sidecar", "environment": "prod",
                "services": ["checkout"], "reason": "e2e"})),
        )
        .await;
    let (old_token, old_id) = (minted["token"].as_str().unwrap(), minted["id"].as_str().unwrap());
    let token_file = dir.path().join("token");
    write_secret(&token_file, old_token);
    // A loopback port nothing listens on: connections to it are refused.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };

    let mut cmd = SidecarProcess::command(&dir.path().join("cache"));
    cmd.env("LEVEE_SYNC_URL", format!("{dead},http://{}", server.grpc))
        .env("LEVEE_AGENT_TOKEN_FILE", &token_file);
    let sidecar = SidecarProcess::spawn(cmd).await;
    let client = reqwest::Client::new();
    sidecar_reads(&client, &sidecar.base, true).await;
    api.set_recommendations(false).await;
    sidecar_reads(&client, &sidecar.base, false).await;
    let first_connected_at = sidecar_connected_at(&api).await;

    // Rotation: the new token goes into the file, then the old one is revoked, which ends
    // the sidecar's stream; a connection after that can only be the file's new token's.
    let rotated = api
        .send(
            Method::POST,
            &format!("/tokens/{old_id}/rotate"),
            Some(json!({"overlap": "1h", "reason": "e2e rotation"})),
        )
        .await;
    write_secret(&token_file, rotated["token"].as_str().unwrap());
    api.send(Method::DELETE, &format!("/tokens/{old_id}?reason=rotated"), None).await;
    let start = tokio::time::Instant::now();
    while sidecar_connected_at(&api).await <= first_connected_at {
        assert!(start.elapsed() < PATIENCE, "the sidecar did not reconnect with the rotated token");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    api.set_recommendations(true).await;
    sidecar_reads(&client, &sidecar.base, true).await;
    api.set_recommendations(false).await;
    sidecar_reads(&client, &sidecar.base, false).await;
    sidecar.kill().await;
    server.kill().await;
}
