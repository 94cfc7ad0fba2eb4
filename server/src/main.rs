//! `levee`: the Levee control-plane server and its admin commands.

use clap::{Parser, Subcommand};
use levee_server::actions::{Actions, Actor, NewUser, Reason, UserChange};
use levee_server::config::{ServeArgs, Settings};
use levee_server::db::{Role, Store};
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(name = "levee", version, about = "Levee: resilience control plane with kill switches")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the server (API + UI on LEVEE_HTTP_ADDR, agent sync on LEVEE_GRPC_ADDR).
    Serve(ServeArgs),
    /// Applies database migrations and exits.
    Migrate(ServeArgs),
    /// Turns resilience4j, Envoy, Istio, Sentinel or Hystrix settings into a Levee
    /// manifest (stdout) and a report of every setting, mapped or not (stderr).
    Import(levee_server::import::ImportArgs),
    /// Commands that talk to a Levee server over its API (login, get, export, apply, flip).
    #[command(flatten)]
    Client(levee_server::cli::ClientCommand),
    /// Writes a consistent copy of the SQLite database to a new file, while the server
    /// runs (PostgreSQL: use pg_dump, see docs/operations.md).
    Backup {
        /// The backup file to create (it must not exist).
        #[arg(long)]
        to: std::path::PathBuf,
        #[command(flatten)]
        args: ServeArgs,
    },
    /// Puts a backup in place as the SQLite database (the server stopped), then moves
    /// every service past its restored revision so agents take it.
    Restore {
        /// The backup file (made by `levee backup`).
        #[arg(long, required_unless_present = "revisions_only")]
        from: Option<std::path::PathBuf>,
        /// Only move every service's revision up, on the configured database (after a
        /// PostgreSQL restore with pg_restore).
        #[arg(long, conflicts_with_all = ["from", "force"])]
        revisions_only: bool,
        /// Keep an existing database aside (`<file>.before-restore-<ms>`) instead of refusing.
        #[arg(long)]
        force: bool,
        /// How far every service's revision moves up: above any revision agents applied
        /// from changes made after the backup.
        #[arg(long, default_value_t = 1000)]
        revision_gap: u64,
        /// Why, recorded in the audit log.
        #[arg(long, default_value = "restored from a backup with levee restore")]
        reason: String,
        #[command(flatten)]
        args: ServeArgs,
    },
    /// Follows one service like an agent and serves its flags over OFREP on a loopback
    /// address, for services that cannot embed the agent crate (docs/ofrep.md).
    Sidecar(levee_server::sidecar::SidecarArgs),
    /// Manages users.
    Users {
        #[command(subcommand)]
        command: UsersCommand,
        #[command(flatten)]
        args: ServeArgs,
    },
}

#[derive(Debug, Subcommand)]
enum UsersCommand {
    /// Creates a user, or sets the password and role of an existing one. The password is
    /// read from the LEVEE_USER_PASSWORD environment variable, or from the file
    /// LEVEE_USER_PASSWORD_FILE names.
    Set {
        /// Login name (the rule for names is in the error for a bad one).
        username: String,
        /// Role: viewer, operator or admin.
        #[arg(long, default_value = "viewer")]
        role: String,
        /// Why, recorded in the audit log.
        #[arg(long, default_value = "set with levee users set")]
        reason: String,
    },
}

/// Logs to stdout, in colour only when stdout is a terminal: a log written to a file, a
/// pipe or journald carries no escape codes.
fn init_tracing(filter: &str) {
    use std::io::IsTerminal;
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::stdout().is_terminal())
        .try_init();
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // An error is printed as every command prints one (`error: …`, each cause on its own
    // line), never as anyhow's `Error:` with a backtrace when RUST_BACKTRACE is set.
    match run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<std::process::ExitCode> {
    // A usage error exits 1, not clap's 2: `levee apply --dry-run` exits 2 for "the plan
    // has changes", and a CI job must not read a typo as that.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return Ok(if e.use_stderr() {
                std::process::ExitCode::FAILURE
            } else {
                std::process::ExitCode::SUCCESS
            });
        }
    };
    let done = match cli.command.unwrap_or(Command::Serve(ServeArgs::default_from_env())) {
        Command::Client(c) => return Ok(levee_server::cli::run(c).await),
        Command::Serve(args) => serve(Settings::load(args)?).await,
        Command::Import(args) => levee_server::import::run_cli(&args),
        Command::Sidecar(args) => {
            init_tracing(&std::env::var("LEVEE_LOG").unwrap_or_else(|_| "info".into()));
            levee_server::sidecar::run(args, shutdown_signal()).await
        }
        Command::Migrate(args) => {
            let s = Settings::load(args)?;
            init_tracing(&s.log);
            if s.database_url.expose().starts_with("sqlite:") {
                levee_server::db::private_dir(&s.data_dir)?;
            }
            Store::connect(s.database_url.expose()).await?;
            println!("migrations applied");
            Ok(())
        }
        Command::Backup { to, args } => {
            let s = Settings::load(args)?;
            init_tracing(&s.log);
            let store = Store::connect(s.database_url.expose()).await?;
            let contents = store.backup_to(&to).await?;
            store.close().await;
            println!("backup written to {} ({contents})", to.display());
            Ok(())
        }
        Command::Restore { from, revisions_only: _, force, revision_gap, reason, args } => {
            let s = Settings::load(args)?;
            init_tracing(&s.log);
            let reason = Reason::parse(&reason).map_err(|e| anyhow::anyhow!("--reason: {e}"))?;
            if let Some(from) = from {
                anyhow::ensure!(
                    s.database_url.expose().starts_with("sqlite:"),
                    "the database is PostgreSQL: restore it with pg_restore, then run `levee restore \
                     --revisions-only` (docs/operations.md, \"Backup and restore\")"
                );
                let target = levee_server::db::sqlite_path(s.database_url.expose())?;
                let contents = levee_server::db::restore_file(&from, &target, force).await?;
                println!("restored {} to {} ({contents})", from.display(), target.display());
            }
            // Migrations of this version apply to an older backup here.
            let store = Store::connect(s.database_url.expose()).await?;
            let actions = local_actions(&store, &s).await?;
            let by =
                Actor::local(std::env::var("USER").map(|u| format!("local:{u}")).unwrap_or("local".into()));
            let moved =
                actions.restored(&by, &reason, revision_gap).await.map_err(|e| anyhow::anyhow!("{e}"))?;
            store.close().await;
            println!("{} services moved up by {revision_gap} revisions (agents never go back)", moved.len());
            Ok(())
        }
        Command::Users { command: UsersCommand::Set { username, role, reason }, args } => {
            let s = Settings::load(args)?;
            init_tracing(&s.log);
            let role = Role::parse(&role)
                .ok_or_else(|| anyhow::anyhow!("--role must be viewer, operator or admin"))?;
            levee_agent::policy::check_name(&username).map_err(|m| anyhow::anyhow!("username {m}"))?;
            let password = user_password()?;
            levee_server::auth::check_password(&password).map_err(|m| anyhow::anyhow!("the password {m}"))?;
            if s.database_url.expose().starts_with("sqlite:") {
                levee_server::db::private_dir(&s.data_dir)?;
            }
            let store = Store::connect(s.database_url.expose()).await?;
            let actions = local_actions(&store, &s).await?;
            // Audited like the same change through the API, as the operating-system user.
            let by =
                Actor::local(std::env::var("USER").map(|u| format!("local:{u}")).unwrap_or("local".into()));
            let reason = Reason::parse(&reason).map_err(|e| anyhow::anyhow!("--reason: {e}"))?;
            if store.user(&username).await?.is_none() {
                let new = NewUser::new(&username, password, role).map_err(|e| anyhow::anyhow!("{e}"))?;
                actions.create_user(&by, &reason, new).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                println!("user {username} created with role {}", role.as_str());
            } else {
                let change = UserChange::new(&username, Some(password), Some(role), Some(false))
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                actions.update_user(&by, &reason, change).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                println!(
                    "user {username} updated with role {}, enabled; its sessions have ended",
                    role.as_str()
                );
            }
            Ok(())
        }
    };
    done.map(|()| std::process::ExitCode::SUCCESS)
}

/// The password of `levee users set`: `LEVEE_USER_PASSWORD`, or the content of the file
/// `LEVEE_USER_PASSWORD_FILE` names without its final line ending (as every secret
/// setting's `_FILE` twin).
fn user_password() -> anyhow::Result<String> {
    match (std::env::var("LEVEE_USER_PASSWORD"), std::env::var_os("LEVEE_USER_PASSWORD_FILE")) {
        (Ok(_), Some(_)) => {
            anyhow::bail!("LEVEE_USER_PASSWORD and LEVEE_USER_PASSWORD_FILE are both set: give one")
        }
        (Ok(p), None) => Ok(p),
        (Err(_), Some(path)) => {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                anyhow::anyhow!(
                    "reading LEVEE_USER_PASSWORD_FILE {}: {e}",
                    std::path::Path::new(&path).display()
                )
            })?;
            let p = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
            Ok(p.to_string())
        }
        (Err(_), None) => {
            anyhow::bail!("set LEVEE_USER_PASSWORD (or LEVEE_USER_PASSWORD_FILE) to the new password")
        }
    }
}

/// The actions over `store` for a command run without a server (the token keys are the
/// server's, from the same settings).
async fn local_actions(store: &Store, s: &Settings) -> anyhow::Result<Actions> {
    let keys = levee_server::app::keys(store, s).await?;
    Ok(Actions::new(store.clone(), levee_server::hub::Hub::default(), keys))
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    init_tracing(&settings.log);
    let metrics = levee_server::app::prometheus_builder().install_recorder().ok();
    let data_dir = settings.data_dir.clone();
    let server = levee_server::Server::start(settings, metrics).await?;
    if let Some(p) = &server.generated_admin_password {
        announce_initial_password(&data_dir, p);
    }
    println!(
        "levee listening: http://{} (API, UI)  grpc://{} (agent sync)",
        server.http_addr, server.grpc_addr
    );
    tracing::info!(http = %server.http_addr, grpc = %server.grpc_addr, "levee started");
    shutdown_signal().await;
    tracing::info!("shutting down");
    server.shutdown().await;
    Ok(())
}

/// Hands the generated password of the first admin to the operator without putting it in
/// a log: it is written once to a file readable by this user only in the data directory
/// (the file's path is logged), and printed only when standard output is a terminal (an
/// interactive first start); journald, `docker logs` and `kubectl logs` get the path.
fn announce_initial_password(data_dir: &std::path::Path, password: &str) {
    use std::io::IsTerminal;
    match levee_server::app::write_initial_admin_password(data_dir, password) {
        Ok(path) => {
            tracing::warn!(
                file = %path.display(),
                "bootstrap admin `admin` created with a generated password, written to this file \
                 (readable by this user only): log in, change it, then delete the file"
            );
            if std::io::stdout().is_terminal() {
                println!("Bootstrap admin user created. username: admin  password: {password}");
                println!(
                    "(shown once, also in {}; set LEVEE_ADMIN_PASSWORD to choose it yourself)",
                    path.display()
                );
            } else {
                println!("Bootstrap admin user created. username: admin  password in {}", path.display());
            }
        }
        Err(e) if std::io::stdout().is_terminal() => {
            tracing::warn!(error = %e, "the generated admin password could not be written to a file");
            println!("Bootstrap admin user created. username: admin  password: {password}");
            println!("(shown once; set LEVEE_ADMIN_PASSWORD to choose it yourself)");
        }
        Err(e) => tracing::error!(
            error = %e,
            "bootstrap admin `admin` created with a generated password that could not be written to a \
             file and is not logged: set one with `levee users set admin` (LEVEE_USER_PASSWORD)"
        ),
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
