//! The `levee` binary's log, as a log shipper or `| tee` sees it.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::levee_serve;

/// Written to a pipe, the log carries no colour codes (they are for terminals only).
#[tokio::test]
async fn server_logs_carry_no_colour_codes_when_not_written_to_a_terminal() {
    let data = tempfile::tempdir().unwrap();
    let mut child = levee_serve(data.path(), "127.0.0.1:0", "127.0.0.1:0", "info")
        .stderr(Stdio::null())
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
