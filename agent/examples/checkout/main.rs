//! Example service embedding the Levee agent. See `app.rs` and the README walkthrough.
//!
//! Run with `cargo run --release -p levee-agent --features reqwest-middleware,axum
//! --example checkout`. Environment:
//! * `LEVEE_AGENT_TOKEN`: agent token scoped to the environment and `checkout`; or
//!   `LEVEE_AGENT_TOKEN_FILE`: a file holding it, read again before every connection (a
//!   mounted secret: a rotated token is used without a restart). One of them is required.
//! * `LEVEE_GRPC_URL`: the server's sync endpoint (default `http://127.0.0.1:8081`); a
//!   comma-separated list is tried in turn.
//! * `LEVEE_ENVIRONMENT`: environment (default `prod`).
//! * `LEVEE_CACHE_DIR`: disk cache (default `./levee-agent-cache`, relative to the
//!   directory the command runs in).
//! * `CHECKOUT_ADDR`: where checkout listens (default `127.0.0.1:3000`).
//! * `PRICING_ADDR`, `RECOMMENDATIONS_ADDR`: where the two fake dependencies listen
//!   (defaults `127.0.0.1:3001` and `127.0.0.1:3002`).

mod app;

use std::io::IsTerminal;
use std::sync::Arc;

use levee_agent::Agent;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// Logs to stdout (`RUST_LOG` filter), in colour only when stdout is a terminal: a log
/// written to a file or piped to another program carries no escape codes.
fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(env("RUST_LOG", "info,levee_agent=info"))
        .with_ansi(std::io::stdout().is_terminal())
        .init();
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    init_logging();
    let _ = app::metrics_handle(); // the Prometheus recorder, before anything registers a metric
    let token_file = std::env::var_os("LEVEE_AGENT_TOKEN_FILE");
    let token = match (&token_file, std::env::var("LEVEE_AGENT_TOKEN")) {
        (Some(_), _) => String::new(),
        (None, Ok(t)) => t,
        (None, Err(_)) => {
            return Err(
                "set LEVEE_AGENT_TOKEN (or LEVEE_AGENT_TOKEN_FILE) to an agent token (see README)".into()
            );
        }
    };
    let urls = env("LEVEE_GRPC_URL", "http://127.0.0.1:8081");
    let mut urls = urls.split(',').map(str::trim).filter(|u| !u.is_empty());
    let mut builder =
        Agent::builder(urls.next().unwrap_or_default(), token, env("LEVEE_ENVIRONMENT", "prod"), "checkout");
    for url in urls {
        builder = builder.fallback_server(url);
    }
    if let Some(path) = token_file {
        builder = builder.token_file(path);
    }
    let agent = builder
        .cache_dir(env("LEVEE_CACHE_DIR", "levee-agent-cache"))
        .defaults(app::safe_defaults())
        .build()?;
    let control = Arc::new(app::RecsControl::default());
    let pricing = app::start_pricing(env("PRICING_ADDR", "127.0.0.1:3001").parse()?).await?;
    let recs =
        app::start_recommendations(env("RECOMMENDATIONS_ADDR", "127.0.0.1:3002").parse()?, control).await?;
    let checkout =
        app::start_checkout(env("CHECKOUT_ADDR", "127.0.0.1:3000").parse()?, &agent, pricing, recs).await?;
    let status = agent.status();
    println!("checkout         http://{checkout}/checkout/alice");
    println!(
        "  status         http://{checkout}/levee/status   readiness http://{checkout}/ready   metrics http://{checkout}/metrics"
    );
    println!(
        "pricing          http://{pricing}/price/alice     (POST /control {{\"delay_ms\":5000}} or {{\"fail\":true}})"
    );
    println!("recommendations  http://{recs}/recommendations/alice   (POST /control, as pricing)");
    println!("levee agent      source={} revision={}", status.source, status.revision);
    tokio::signal::ctrl_c().await?;
    agent.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::time::Duration;

    use super::*;

    const CHILD: &str = "CHECKOUT_LOG_TEST_CLOSED_PORT";

    /// The showcase endpoints on a real checkout (loopback, port 0, agent on its compiled-in
    /// defaults): a page through the middleware and `Feature::serve`, `/ready`,
    /// `/levee/status` as JSON (not a Debug string), and `/metrics` in the Prometheus format
    /// with the call's operation as its label.
    #[tokio::test]
    async fn example_serves_pages_readiness_status_json_and_metrics() {
        let agent = Agent::builder("http://127.0.0.1:9", "token", "prod", "checkout")
            .defaults(app::safe_defaults())
            .build()
            .unwrap();
        let any = "127.0.0.1:0".parse().unwrap();
        let pricing = app::start_pricing(any).await.unwrap();
        let recs = app::start_recommendations(any, Arc::new(app::RecsControl::default())).await.unwrap();
        let checkout = app::start_checkout(any, &agent, pricing, recs).await.unwrap();
        let http = reqwest::Client::new();
        let get = |path: &str| http.get(format!("http://{checkout}{path}")).send();

        let page: app::CheckoutPage = get("/checkout/alice").await.unwrap().json().await.unwrap();
        assert_eq!(page.recommendations_level, "FRESH", "{page:?}");
        assert_eq!(page.total_cents, 4200);
        assert_eq!(get("/ready").await.unwrap().status(), reqwest::StatusCode::OK);

        let status: serde_json::Value = get("/levee/status").await.unwrap().json().await.unwrap();
        assert_eq!(status["agent"]["source"], "default", "{status}");
        assert_eq!(status["agent"]["revision"], 0);
        assert_eq!(status["ready"], true);
        assert_eq!(status["dependencies"]["recommendations"]["breaker"], "CLOSED");
        assert_eq!(status["dependencies"]["recommendations"]["enabled"], true);

        let metrics = get("/metrics").await.unwrap().text().await.unwrap();
        assert!(
            metrics.lines().any(|l| l.starts_with("levee_calls_total")
                && l.contains(r#"operation="GET /recommendations/{user}""#)
                && l.contains(r#"outcome="ok""#)),
            "{metrics}"
        );
    }

    /// The example's log, piped: no colour codes, and the agent's connection error printed
    /// with each cause once ("tcp connect error: tcp connect error" before). The test runs
    /// itself again as a child whose stdout is a pipe, as a log shipper or `| tee` would
    /// see it; the child logs through `init_logging` and an agent whose server refuses the
    /// connection.
    #[test]
    fn logs_carry_no_colour_codes_and_no_repeated_causes_when_piped() {
        if let Ok(port) = std::env::var(CHILD) {
            init_logging();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let _agent = Agent::builder(format!("http://127.0.0.1:{port}"), "token", "prod", "checkout")
                    .defaults(app::safe_defaults())
                    .build()
                    .unwrap();
                std::future::pending::<()>().await; // the parent kills this process
            });
            return;
        }
        // A port nothing listens on: the connection is refused at once.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tests::logs_carry_no_colour_codes_and_no_repeated_causes_when_piped",
                "--nocapture",
            ])
            .env(CHILD, port.to_string())
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut seen = Vec::new();
        let lost = loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(line) if line.contains("levee sync stream lost") => break line,
                Ok(line) => seen.push(line),
                Err(e) => {
                    let _ = child.kill();
                    panic!("no connection error logged ({e}); saw {seen:?}");
                }
            }
        };
        child.kill().unwrap();
        let _ = child.wait();
        seen.push(lost.clone());
        assert!(seen.iter().any(|l| l.contains("levee agent starting")), "{seen:?}");
        for line in &seen {
            assert!(!line.contains('\x1b'), "escape codes in a piped log: {line:?}");
        }
        assert!(lost.contains("Connection refused"), "{lost}");
        assert!(lost.matches("tcp connect error").count() <= 1, "a cause printed twice: {lost}");
    }
}
