//! The `levee` binary's log, as a log shipper or `| tee` sees it.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// Written to a pipe, the log carries no colour codes (they are for terminals only).
#[tokio::test]
async fn server_logs_carry_no_colour_codes_when_not_written_to_a_terminal() {
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_levee"))
        .arg("serve")
        .env("LEVEE_DATA_DIR", data.path())
        .env("LEVEE_HTTP_ADDR", "127.0.0.1:0")
        .env("LEVEE_GRPC_ADDR", "127.0.0.1:0")
        .env("LEVEE_ADMIN_PASSWORD", crate::helpers::ADMIN_PASSWORD)
        .env("LEVEE_LOG", "info")
        .env_remove("LEVEE_DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("levee binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(l) = lines.next_line().await.unwrap() {
            let started = l.contains("levee started");
            seen.push(l);
            if started {
                return;
            }
        }
        panic!("levee exited before logging its start: {seen:?}");
    })
    .await
    .expect("levee logs its start");
    child.kill().await.unwrap();
    assert!(seen.iter().any(|l| l.contains(" INFO ")), "{seen:?}");
    for line in &seen {
        assert!(!line.contains('\x1b'), "escape codes in a piped log: {line:?}");
    }
}
