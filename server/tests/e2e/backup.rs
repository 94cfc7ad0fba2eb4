//! The backup drill: `levee backup` of a running server's SQLite database while changes
//! are being made, `levee restore` onto a new data directory, a server started on it —
//! every change acknowledged before the backup started is there, the audit log has one
//! row per revision and no hole, and agents that applied changes made after the backup
//! (lost with it) converge on the restored server.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use sqlx::Row;

use crate::support::{Api, BinServer, agent, wait_until};

/// Services written concurrently during the backup.
const SERVICES: usize = 4;
/// Acknowledged writes before the backup starts.
const BEFORE: usize = 60;
/// Acknowledged writes after the backup finished, before the server stops.
const AFTER: usize = 30;

/// Runs `levee` with `args` on the data directory `data`; returns its stdout, panicking
/// with its output when it fails.
async fn levee(data: &std::path::Path, args: &[&str]) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_levee"))
        .args(args)
        .env("LEVEE_DATA_DIR", data)
        .env_remove("LEVEE_DATABASE_URL")
        .env("LEVEE_LOG", "warn")
        .output()
        .await
        .expect("levee runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "levee {args:?} failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backup_restore_drill_keeps_every_acknowledged_change_and_agents_converge() {
    let root = tempfile::tempdir().unwrap();
    let (old_data, new_data) = (root.path().join("old"), root.path().join("new"));
    let server = BinServer::start(&old_data, "127.0.0.1:0", "127.0.0.1:0").await;
    let base = format!("http://{}", server.http);
    let api = Api::login(&base).await;
    api.seed().await;
    for i in 0..SERVICES {
        api.send(
            reqwest::Method::POST,
            "/environments/prod/services",
            Some(json!({"name": format!("svc{i}"), "reason": "drill", "flags": {"f": {"type": "int", "value": -1}}})),
        )
        .await;
    }
    let token = api.agent_token("prod", &["checkout"]).await;
    let caches = root.path().join("caches");
    let agents: Vec<_> = (0..2)
        .map(|i| agent(&format!("http://{}", server.grpc), &token, &caches.join(format!("a{i}"))))
        .collect();
    for a in &agents {
        a.wait_for_initial_sync(Duration::from_secs(10)).await.expect("agent syncs");
    }

    // Writers: every service's flag, and the kill switch the agents follow, rewritten over
    // and over; each acknowledged write is recorded with the moment its answer came.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, u64, String, tokio::time::Instant)>();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..=SERVICES {
        let (tx, stop, token, base) = (tx.clone(), stop.clone(), api.token.clone(), base.clone());
        writers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut k = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                k += 1;
                let (service, path, body) = if w == SERVICES {
                    let on = k % 2 == 0;
                    ("checkout".to_string(), "flags/recommendations.enabled", json!({"value": on}))
                } else {
                    (format!("svc{w}"), "flags/f", json!({"value": k}))
                };
                let reason = format!("drill write {w}-{k}");
                let mut body = body;
                body["reason"] = json!(reason);
                let res = client
                    .patch(format!("{base}/api/v1/environments/prod/services/{service}/{path}"))
                    .bearer_auth(&token)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert!(res.status().is_success(), "write refused: {}", res.status());
                let v: serde_json::Value = res.json().await.unwrap();
                let _ =
                    tx.send((service, v["revision"].as_u64().unwrap(), reason, tokio::time::Instant::now()));
            }
        }));
    }
    drop(tx);
    let mut acked = Vec::new();
    while acked.len() < BEFORE {
        acked.push(rx.recv().await.unwrap());
    }

    let backup = root.path().join("levee.backup");
    let started = tokio::time::Instant::now();
    let summary = levee(&old_data, &["backup", "--to", &backup.display().to_string()]).await;
    assert!(summary.starts_with("backup written to "), "{summary}");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&backup).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the backup file is private");
    let done = acked.len();
    while acked.len() < done + AFTER {
        acked.push(rx.recv().await.unwrap());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    while let Some(a) = rx.recv().await {
        acked.push(a);
    }
    // The agents applied the last kill-switch change, made after the backup.
    let last_switch = acked.iter().filter(|a| a.0 == "checkout").map(|a| a.1).max().unwrap();
    for a in &agents {
        wait_until("agents on the last change", Duration::from_secs(10), || {
            a.status().revision == last_switch
        })
        .await;
    }
    server.kill().await;
    for a in agents {
        a.shutdown().await;
    }

    let restored = levee(&new_data, &["restore", "--from", &backup.display().to_string()]).await;
    assert!(restored.contains("moved up by 1000 revisions"), "{restored}");
    // Restoring over an existing database is refused without --force.
    let refused = tokio::process::Command::new(env!("CARGO_BIN_EXE_levee"))
        .args(["restore", "--from", &backup.display().to_string()])
        .env("LEVEE_DATA_DIR", &new_data)
        .env_remove("LEVEE_DATABASE_URL")
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--force"), "{refused:?}");

    // What the restored database holds.
    sqlx::any::install_default_drivers();
    let url = format!("sqlite://{}?mode=ro", new_data.join("levee.db").display());
    let pool = sqlx::any::AnyPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
    let mut stored: BTreeMap<(String, u64), String> = BTreeMap::new();
    for r in sqlx::query("SELECT service, revision, reason FROM revisions WHERE environment = 'prod'")
        .fetch_all(&pool)
        .await
        .unwrap()
    {
        stored.insert(
            (r.try_get("service").unwrap(), r.try_get::<i64, _>("revision").unwrap() as u64),
            r.try_get("reason").unwrap(),
        );
    }
    let before_backup: Vec<_> = acked.iter().filter(|a| a.3 < started).collect();
    assert!(before_backup.len() >= BEFORE);
    eprintln!(
        "{} writes acknowledged, {} of them before the backup started; backup: {}",
        acked.len(),
        before_backup.len(),
        summary.trim()
    );
    for (service, revision, reason, _) in &before_backup {
        assert_eq!(
            stored.get(&(service.clone(), *revision)),
            Some(reason),
            "{service} revision {revision} was acknowledged before the backup and is missing"
        );
    }
    // Per service: revisions 1..=r without a hole, each with exactly one `ok` audit row, then
    // the restore's revision r + 1000 with its `service.restore` row.
    let mut audited: BTreeMap<(String, u64), Vec<String>> = BTreeMap::new();
    let mut ids = Vec::new();
    for r in sqlx::query("SELECT id, service, revision, action FROM audit WHERE outcome = 'ok' ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap()
    {
        ids.push(r.try_get::<i64, _>("id").unwrap());
        if let (Ok(Some(service)), Ok(Some(rev))) =
            (r.try_get::<Option<String>, _>("service"), r.try_get::<Option<i64>, _>("revision"))
        {
            audited.entry((service, rev as u64)).or_default().push(r.try_get("action").unwrap());
        }
    }
    let all_ids: Vec<i64> =
        sqlx::query_scalar::<_, i64>("SELECT id FROM audit ORDER BY id").fetch_all(&pool).await.unwrap();
    assert_eq!(all_ids, (1..=all_ids.len() as i64).collect::<Vec<_>>(), "the audit log has a hole");
    for service in ["checkout".to_string()].into_iter().chain((0..SERVICES).map(|i| format!("svc{i}"))) {
        let revs: Vec<u64> = stored.keys().filter(|(s, _)| *s == service).map(|(_, r)| *r).collect();
        let (&top, rest) = revs.split_last().unwrap();
        let restored_from = *rest.last().unwrap();
        assert_eq!(top, restored_from + 1000, "{service}: the restore's revision");
        assert_eq!(
            rest.to_vec(),
            (1..=restored_from).collect::<Vec<_>>(),
            "{service}: a hole in the revisions"
        );
        for r in rest {
            assert_eq!(
                audited.get(&(service.clone(), *r)).map(Vec::len),
                Some(1),
                "{service} revision {r}: audit rows"
            );
        }
        assert_eq!(audited[&(service.clone(), top)], vec!["service.restore".to_string()]);
    }
    pool.close().await;

    // A server on the restored directory: the agents, back from their caches (holding a
    // change lost with the backup), take the restored configuration, and a new change.
    let server = BinServer::start(&new_data, "127.0.0.1:0", "127.0.0.1:0").await;
    let base = format!("http://{}", server.http);
    let api = Api::login(&base).await;
    let current = api.send(reqwest::Method::GET, "/environments/prod/services/checkout", None).await;
    let restored_rev = current["revision"].as_u64().unwrap();
    assert!(restored_rev > last_switch, "{restored_rev} is above what the agents hold ({last_switch})");
    let agents: Vec<_> = (0..2)
        .map(|i| agent(&format!("http://{}", server.grpc), &token, &caches.join(format!("a{i}"))))
        .collect();
    for a in &agents {
        wait_until("agents on the restored revision", Duration::from_secs(15), || {
            a.status().revision == restored_rev
        })
        .await;
    }
    let flipped = api.set_recommendations(false).await;
    for a in &agents {
        wait_until("agents on a change after the restore", Duration::from_secs(10), || {
            a.status().revision == flipped
        })
        .await;
        assert!(!a.flag_bool("recommendations.enabled", true).get());
    }
    for a in agents {
        a.shutdown().await;
    }
    server.kill().await;
}
