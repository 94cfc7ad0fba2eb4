//! The first start: two replicas starting together on an empty PostgreSQL agree on one
//! signing secret and one first admin; a generated admin password never reaches the log
//! (it goes to a 0600 file whose path is logged), and the SQLite file is private.

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::Duration;

use levee_server::Server;
use levee_server::config::{Secret, Settings};
use reqwest::StatusCode;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::helpers::postgres_url;

async fn login(client: &reqwest::Client, base: &str, password: &str) -> (StatusCode, Option<String>) {
    let res = client
        .post(format!("{base}/api/v1/auth/login"))
        .json(&serde_json::json!({"username": "admin", "password": password}))
        .send()
        .await
        .unwrap();
    let status = res.status();
    let token =
        res.json::<serde_json::Value>().await.ok().and_then(|v| v["token"].as_str().map(str::to_string));
    (status, token)
}

/// Two replicas started at the same moment on an empty database, neither given an admin
/// password nor a JWT secret, five times over: both start every time; exactly one of them
/// created `admin` and reports a generated password, which is the stored one (it logs in
/// on both replicas); both sign with one secret (a session from one is accepted by the
/// other); the database holds one admin and one secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bootstrap_two_replicas_started_together_on_an_empty_postgres_agree() {
    let client = reqwest::Client::new();
    for round in 0..5 {
        let Some(url) = postgres_url().await else { return };
        let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let settings = |dir: &std::path::Path| {
            let mut s = Settings::for_dir(dir);
            s.database_url = Secret::new(url.clone());
            s
        };
        let t = tokio::time::Instant::now();
        let (a, b) =
            tokio::join!(Server::start(settings(da.path()), None), Server::start(settings(db.path()), None));
        eprintln!("round {round}: started in {:?}", t.elapsed());
        let (a, b) = (a.expect("replica a starts"), b.expect("replica b starts"));
        let generated: Vec<&String> =
            [&a, &b].iter().filter_map(|s| s.generated_admin_password.as_ref()).collect();
        assert_eq!(generated.len(), 1, "round {round}: exactly one replica created the admin");
        let password = generated[0].clone();
        let (base_a, base_b) = (format!("http://{}", a.http_addr), format!("http://{}", b.http_addr));
        for base in [&base_a, &base_b] {
            assert_eq!(
                login(&client, base, &password).await.0,
                StatusCode::OK,
                "round {round}: login on {base}"
            );
        }
        let (_, token) = login(&client, &base_a, &password).await;
        let res = client
            .get(format!("{base_b}/api/v1/environments"))
            .bearer_auth(token.unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "round {round}: a session of a is accepted by b");
        let admins: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM users WHERE username = 'admin'")
            .fetch_one(a.store.pool())
            .await
            .unwrap();
        assert_eq!(admins, 1);
        let t = tokio::time::Instant::now();
        a.shutdown().await;
        b.shutdown().await;
        eprintln!("round {round}: stopped in {:?}", t.elapsed());
    }
}

/// `levee serve` on a fresh data directory without LEVEE_ADMIN_PASSWORD, its output a pipe
/// (as under systemd or in a container): the generated password is in
/// `<data_dir>/initial-admin-password` (0600), whose path the output names, and nowhere in
/// the output; it logs in. The data directory is 0700 and the SQLite files are 0600.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_admin_password_goes_to_a_private_file_not_to_the_log() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let mut cmd = crate::support::levee_serve(&data, "127.0.0.1:0", "127.0.0.1:0", "info");
    cmd.env_remove("LEVEE_ADMIN_PASSWORD");
    let mut child = cmd.stderr(Stdio::piped()).spawn().expect("levee starts");
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut output = Vec::new();
    let listening = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(l) = out.next_line().await.unwrap() {
            output.push(l.clone());
            if l.starts_with("levee listening:") {
                return l;
            }
        }
        panic!("levee exited before listening: {output:?}");
    })
    .await
    .expect("levee listens");
    let http = listening.split("http://").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
    child.start_kill().unwrap();
    let _ = child.wait().await;
    while let Ok(Some(l)) = out.next_line().await {
        output.push(l);
    }
    while let Ok(Some(l)) = err.next_line().await {
        output.push(l);
    }

    let file = data.join(levee_server::app::INITIAL_ADMIN_PASSWORD_FILE);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600, "the password file is private");
    let password = std::fs::read_to_string(&file).unwrap().trim_end().to_string();
    assert!(password.len() >= 20, "{password:?}");
    assert!(!output.iter().any(|l| l.contains(&password)), "the password reached the output: {output:#?}");
    let path = file.display().to_string();
    assert!(output.iter().any(|l| l.contains(&path)), "the output names the file: {output:#?}");
    assert_eq!(mode(&data), 0o700, "the data directory is private");
    for f in ["levee.db", "levee.db-wal", "levee.db-shm"] {
        let p = data.join(f);
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{f} is private");
        }
    }
    assert_eq!(mode(&data.join("levee.db")), 0o600);

    // The password is the stored one.
    let mut again = crate::support::levee_serve(&data, "127.0.0.1:0", "127.0.0.1:0", "warn");
    again.env_remove("LEVEE_ADMIN_PASSWORD").env("LEVEE_HTTP_ADDR", &http);
    let mut child = again.stderr(Stdio::inherit()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(l) = out.next_line().await.unwrap() {
            if l.starts_with("levee listening:") {
                return;
            }
        }
        panic!("levee exited before listening");
    })
    .await
    .expect("levee listens again");
    let client = reqwest::Client::new();
    assert_eq!(login(&client, &format!("http://{http}"), &password).await.0, StatusCode::OK);
    child.start_kill().unwrap();
    let _ = child.wait().await;
}
