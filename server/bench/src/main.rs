//! `levee-bench`: Levee's harness binary. Everything it starts listens on 127.0.0.1 with a
//! port chosen by the OS; nothing leaves loopback (`overload --target URL` sends to the
//! URL given, a loopback one unless `--allow-non-loopback`).
//!
//! Each mode lives in its own module with its own clap sub-enum, flattened into
//! [`Command`]: `overload/` (tests to failure of inbound admission against the Rust
//! peers, targets.md "Overload behaviour") and `control/` (the control plane at scale:
//! propagation, streams, reconnect, replicas, writes; targets.md "Control plane"; and
//! rollout, targets.md "Change delivery").

use clap::{Parser, Subcommand};

mod control;
mod overload;

/// Levee's harness: drives real servers on loopback and prints what it measured; the last
/// line of every mode is one JSON object.
#[derive(Debug, Parser)]
#[command(name = "levee-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Overload(overload::Command),
    #[command(flatten)]
    Control(control::Command),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Overload(c) => c.run(),
        Command::Control(c) => c.run(),
    }
}
