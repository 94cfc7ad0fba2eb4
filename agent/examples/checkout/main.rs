//! Example service embedding the Levee agent. See `app.rs` and the README walkthrough.
//!
//! Environment:
//! * `LEVEE_AGENT_TOKEN` (required): agent token scoped to the environment and `checkout`.
//! * `LEVEE_GRPC_URL`: the server's sync endpoint (default `http://127.0.0.1:8081`).
//! * `LEVEE_ENVIRONMENT`: environment (default `prod`).
//! * `LEVEE_CACHE_DIR`: disk cache (default `./levee-agent-cache`).
//! * `CHECKOUT_ADDR`: where checkout listens (default `127.0.0.1:3000`).

mod app;

use std::sync::Arc;

use levee_agent::Agent;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter(env("RUST_LOG", "info,levee_agent=info")).init();
    let token = std::env::var("LEVEE_AGENT_TOKEN")
        .map_err(|_| "set LEVEE_AGENT_TOKEN to an agent token (see README)")?;
    let agent = Agent::builder(
        env("LEVEE_GRPC_URL", "http://127.0.0.1:8081"),
        token,
        env("LEVEE_ENVIRONMENT", "prod"),
        "checkout",
    )
    .cache_dir(env("LEVEE_CACHE_DIR", "levee-agent-cache"))
    .defaults(app::safe_defaults())
    .build()?;
    let any = "127.0.0.1:0".parse()?;
    let control = Arc::new(app::RecsControl::default());
    let pricing = app::start_pricing(any).await?;
    let recs = app::start_recommendations(any, control).await?;
    let checkout =
        app::start_checkout(env("CHECKOUT_ADDR", "127.0.0.1:3000").parse()?, &agent, pricing, recs).await?;
    let status = agent.status();
    println!("pricing          http://{pricing}");
    println!("recommendations  http://{recs}   (POST /control {{\"delay_ms\":5000}} or {{\"fail\":true}})");
    println!("checkout         http://{checkout}/checkout/alice");
    println!("levee agent      source={:?} revision={}", status.source, status.revision);
    tokio::signal::ctrl_c().await?;
    agent.shutdown().await;
    Ok(())
}
