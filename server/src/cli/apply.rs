//! `levee apply -f FILE|DIR`: read manifests, ask the server for the plan, show it, and
//! (unless `--dry-run`) write each service based on the revision the plan saw.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::session::{Api, CliError, seg};
use super::{Connection, EXIT_CHANGES, service_path};
use crate::manifest::{self, ServiceManifest};

/// `levee apply`.
#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// A manifest file, or a directory: every *.yaml, *.yml and *.json file under it
    /// (hidden ones skipped). Repeat -f for several.
    #[arg(short = 'f', long = "file", value_name = "FILE|DIR", required = true)]
    pub files: Vec<PathBuf>,
    /// Why, recorded in the audit log with every write; required unless --dry-run (in CI,
    /// e.g. the pull request).
    #[arg(long, required_unless_present = "dry_run")]
    pub reason: Option<String>,
    /// Shows the plan and writes nothing; exits 2 when the plan has changes, 0 when not.
    #[arg(long)]
    pub dry_run: bool,
    /// Also deletes the services of the manifests' environments that no manifest names.
    #[arg(long)]
    pub prune: bool,
    /// Writes a service even where the plan would undo what the active emergency profile
    /// set (a flag it switched); REASON goes with the write as its `override_profile`, which
    /// the server records in the audit reason. Without it, such a service is not written and
    /// apply exits 1.
    #[arg(long, value_name = "REASON")]
    pub override_profile: Option<String>,
    /// Delivers a policy change as a staged rollout (a cohort of instances first, then wider
    /// stages, halted by the server if the cohort does worse), whatever the environment's
    /// setting; `levee rollout status` follows it. Flags are delivered at once.
    #[arg(long, conflicts_with = "immediate")]
    pub staged: bool,
    /// Delivers a policy change to every instance at once, even where the environment
    /// stages policy changes.
    #[arg(long)]
    pub immediate: bool,
    #[command(flatten)]
    pub break_glass: super::BreakGlass,
    /// text (the plan as people read it, writes reported line by line) or json: one JSON
    /// document on stdout with the fields plan, dry_run and results: the
    /// server's plan as `POST /api/v1/plan` answers it and one result per write
    /// (`service`, `action`, and `revision` or `error`). Errors still go to stderr, and the
    /// exit codes are the same.
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: super::Output,
}

/// Where a manifest came from, for error messages.
#[derive(Clone, Debug)]
struct Origin {
    file: String,
    /// From 1, as the manifest module counts documents.
    document: usize,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: document {}", self.file, self.document)
    }
}

fn manifest_files(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), CliError> {
    let err = |e: std::io::Error| CliError::Usage(format!("cannot read {}: {e}", path.display()));
    if !path.is_dir() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(err)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(err)?;
    entries.sort();
    for p in entries {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.starts_with('.') {
            continue;
        }
        if p.is_dir() {
            manifest_files(&p, out)?;
        } else if [".yaml", ".yml", ".json"].iter().any(|ext| name.ends_with(ext)) {
            out.push(p);
        }
    }
    Ok(())
}

/// Reads and checks every manifest of `paths`; every problem of every file is printed.
fn read_manifests(paths: &[PathBuf]) -> Result<Vec<(ServiceManifest, Origin)>, CliError> {
    let mut files = Vec::new();
    for p in paths {
        let before = files.len();
        manifest_files(p, &mut files)?;
        if files.len() == before {
            return Err(CliError::Usage(format!(
                "{}: no manifest files (*.yaml, *.yml, *.json) in it",
                p.display()
            )));
        }
    }
    let mut out: Vec<(ServiceManifest, Origin)> = Vec::new();
    let mut problems = Vec::new();
    for f in &files {
        let name = f.display().to_string();
        let text =
            std::fs::read_to_string(f).map_err(|e| CliError::Usage(format!("cannot read {name}: {e}")))?;
        match manifest::parse(&name, &text) {
            Ok(ms) => {
                for (i, m) in ms.into_iter().enumerate() {
                    let origin = Origin { file: name.clone(), document: i + 1 };
                    if let Some((_, first)) = out.iter().find(|(o, _)| o.key() == m.key()) {
                        problems.push(format!("{origin} ({}): the same service as {first}", m.key()));
                    }
                    out.push((m, origin));
                }
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    if problems.is_empty() { Ok(out) } else { Err(CliError::Usage(problems.join("\n"))) }
}

/// One service of the server's plan (`POST /api/v1/plan`).
#[derive(Debug, Deserialize)]
struct Entry {
    environment: String,
    service: String,
    action: String,
    revision: Option<u64>,
    #[serde(default)]
    changes: Vec<Change>,
    #[serde(default)]
    lints: Vec<Lint>,
    profile: Option<ActiveProfile>,
    #[serde(default)]
    temporary: Vec<Temporary>,
}

/// A flag that keeps its temporary value through the write (`levee flip --for`).
#[derive(Debug, Deserialize)]
struct Temporary {
    key: String,
    value: Value,
    expires_at: Option<String>,
    goes_back_to: GoesBackTo,
}

#[derive(Debug, Deserialize)]
struct GoesBackTo {
    value: Value,
}

/// The active emergency profile that covers a service of the plan.
#[derive(Debug, Deserialize)]
struct ActiveProfile {
    name: String,
    applied_by: String,
    expires_at: String,
    #[serde(default)]
    undoes: Vec<String>,
}

impl Entry {
    /// The active profile whose entries this entry's write would undo.
    fn undoes_profile(&self) -> Option<&ActiveProfile> {
        self.profile.as_ref().filter(|p| !p.undoes.is_empty())
    }
}

#[derive(Debug, Deserialize)]
struct Change {
    path: String,
    op: String,
    before: Option<Value>,
    after: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Lint {
    path: String,
    code: String,
    message: String,
}

#[derive(Debug, Deserialize)]
struct Plan {
    services: Vec<Entry>,
}

/// Puts the file and document in front of the paths of a refused plan
/// (`manifests[3].policy.x` → `FILE: document 2 (prod/checkout): policy.x`).
fn locate(e: CliError, manifests: &[(ServiceManifest, Origin)]) -> CliError {
    let CliError::Api { what, status, detail, errors, current_revision } = e else { return e };
    let errors = errors
        .into_iter()
        .map(|mut f| {
            let located = f.path.strip_prefix("manifests[").and_then(|rest| {
                let (i, rest) = rest.split_once(']')?;
                let (m, origin) = manifests.get(i.parse::<usize>().ok()?)?;
                Some(format!("{origin} ({}): {}", m.key(), rest.trim_start_matches('.')))
            });
            if let Some(p) = located {
                f.path = p;
            }
            f
        })
        .collect();
    CliError::Api { what, status, detail, errors, current_revision }
}

/// A value of the plan in full (compact JSON): a reviewer must see all of what changes.
fn shown(v: &Option<Value>) -> String {
    match v {
        None => "(none)".into(),
        Some(v) => v.to_string(),
    }
}

/// The plan as people read it.
fn render(plan: &Plan, prune: bool) -> String {
    let mut out = String::new();
    let width = plan.services.iter().map(|e| e.environment.len() + e.service.len() + 1).max().unwrap_or(0);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &plan.services {
        *counts.entry(e.action.as_str()).or_default() += 1;
        let name = format!("{}/{}", e.environment, e.service);
        let rev = e.revision.map(|r| format!(" (revision {r})")).unwrap_or_default();
        let (mark, what) = match e.action.as_str() {
            "create" => ("+", "created".to_string()),
            "change" => ("~", format!("changed{rev}")),
            "unchanged" => ("=", "unchanged".to_string()),
            "prune" => ("-", format!("would be pruned{rev}")),
            "unmanaged" => ("?", "not in the manifests (apply --prune would delete it)".to_string()),
            other => ("!", other.to_string()),
        };
        let _ = writeln!(out, "{mark} {name:<width$}  {what}");
        for c in &e.changes {
            // A value that becomes null (an expiry taken away) reads as removed, and one
            // that was null as added: JSON null arrives here as no value.
            let _ = match (c.op.as_str(), &c.before, &c.after) {
                ("added", _, _) | ("changed", None, _) => {
                    writeln!(out, "    + {}: {}", c.path, shown(&c.after))
                }
                ("removed", _, _) | ("changed", _, None) => {
                    writeln!(out, "    - {}: {}", c.path, shown(&c.before))
                }
                _ => writeln!(out, "    ~ {}: {} → {}", c.path, shown(&c.before), shown(&c.after)),
            };
        }
        if let Some(p) = &e.profile {
            let what = if p.undoes.is_empty() {
                "this apply leaves what it set alone".to_string()
            } else {
                format!("this apply would undo {} (set by the profile)", p.undoes.join(", "))
            };
            let _ = writeln!(
                out,
                "    ! emergency profile {} (applied by {}) is active until {}: {what}",
                p.name, p.applied_by, p.expires_at
            );
        }
        for t in &e.temporary {
            let _ = writeln!(
                out,
                "    ! flag {} is temporarily {} until {}: it stays so (a flip with --for); then it goes back to {}, as the manifest says",
                t.key,
                t.value,
                t.expires_at.as_deref().unwrap_or("its expiry"),
                t.goes_back_to.value
            );
        }
        for l in &e.lints {
            let _ = writeln!(out, "    warning: policy.{} [{}]: {}", l.path, l.code, l.message);
        }
    }
    let n = |a: &str| counts.get(a).copied().unwrap_or(0);
    let _ = write!(
        out,
        "Plan: {} to create, {} to change, {} unchanged",
        n("create"),
        n("change"),
        n("unchanged")
    );
    if prune {
        let _ = write!(out, ", {} to prune", n("prune"));
    } else if n("unmanaged") > 0 {
        let _ = write!(out, ", {} not in the manifests (kept; --prune deletes them)", n("unmanaged"));
    }
    out.push_str(".\n");
    out
}

/// `levee apply`.
pub(super) async fn run(a: ApplyArgs) -> Result<ExitCode, CliError> {
    let reason = a.reason.clone().unwrap_or_default();
    if !a.dry_run && reason.trim().is_empty() {
        return Err(CliError::Usage("--reason must say why (it is recorded in the audit log)".into()));
    }
    if a.override_profile.as_deref().is_some_and(|r| r.trim().is_empty()) {
        return Err(CliError::Usage(
            "--override-profile must say why (it is recorded in the audit log)".into(),
        ));
    }
    let json = a.output == super::Output::Json;
    // With -o json a CI job reads stdout: a failure before the plan is a JSON document too.
    let failed_early = |e: CliError| {
        if json {
            println!(
                "{}",
                json!({"plan": null, "dry_run": a.dry_run, "results": [], "error": e.to_string()})
            );
        }
        e
    };
    let manifests = read_manifests(&a.files).map_err(failed_early)?;
    let api = a.connection.api()?.break_glass(a.break_glass.break_glass.as_deref())?;
    let body = json!({
        "manifests": manifests.iter().map(|(m, _)| m).collect::<Vec<_>>(),
        "prune": a.prune,
    });
    let raw: Value = api
        .send(Method::POST, "/plan", Some(&body), None)
        .await
        .map_err(|e| failed_early(locate(e, &manifests)))?;
    let plan: Plan = serde_json::from_value(raw.clone())
        .map_err(|e| CliError::Usage(format!("the server's plan is not what this levee reads: {e}")))?;
    let mut results: Vec<Value> = Vec::new();
    let finish = |results: Vec<Value>, code: ExitCode| {
        if json {
            let doc = json!({"plan": raw, "dry_run": a.dry_run, "results": results});
            println!("{}", serde_json::to_string_pretty(&doc).expect("JSON values serialize"));
        }
        Ok(code)
    };
    if !json {
        print!("{}", render(&plan, a.prune));
    }
    let pending: Vec<&Entry> =
        plan.services.iter().filter(|e| matches!(e.action.as_str(), "create" | "change" | "prune")).collect();
    if pending.is_empty() {
        if !json {
            println!("Nothing to do.");
        }
        return finish(results, ExitCode::SUCCESS);
    }
    if a.dry_run {
        // What the apply would refuse makes the dry run fail too: a CI check on the pull
        // request must not pass when the apply on merge cannot.
        let mut refused = 0;
        for e in &pending {
            if let (Some(p), None) = (e.undoes_profile(), &a.override_profile) {
                refused += 1;
                let message = refused_for_profile(e, p);
                eprintln!("error: {message}");
                results.push(json!({"service": format!("{}/{}", e.environment, e.service),
                                    "action": e.action, "error": message}));
            }
        }
        if refused > 0 {
            eprintln!(
                "Dry run: nothing written; the apply would refuse {refused} service{}.",
                if refused == 1 { "" } else { "s" }
            );
            return finish(results, ExitCode::FAILURE);
        }
        if !json {
            println!("Dry run: nothing written.");
        }
        return finish(results, ExitCode::from(EXIT_CHANGES));
    }
    let by_key: BTreeMap<String, &ServiceManifest> = manifests.iter().map(|(m, _)| (m.key(), m)).collect();
    let mut failed = 0;
    for e in pending {
        let key = format!("{}/{}", e.environment, e.service);
        // The server refuses such a write too; checking the plan first says what and why
        // before anything is written. The override goes to the server, which records it in
        // the audit reason.
        let override_profile = match (e.undoes_profile(), &a.override_profile) {
            (None, _) => None,
            (Some(_), Some(why)) => Some(why.as_str()),
            (Some(p), None) => {
                failed += 1;
                let message = refused_for_profile(e, p);
                eprintln!("error: {message}");
                results.push(json!({"service": key, "action": e.action, "error": message}));
                continue;
            }
        };
        let staged = match (a.staged, a.immediate) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        };
        match write(&api, e, by_key.get(&key).copied(), &reason, override_profile, staged).await {
            Ok((done, revision)) => {
                if !json {
                    println!("{key}: {done}");
                }
                results.push(json!({"service": key, "action": e.action, "revision": revision}));
            }
            Err(err) => {
                failed += 1;
                super::report(&err);
                results.push(json!({"service": key, "action": e.action, "error": err.to_string()}));
            }
        }
    }
    if failed > 0 {
        eprintln!(
            "{failed} service{} not applied; the others were applied or had nothing to change",
            if failed == 1 { "" } else { "s" }
        );
        return finish(results, ExitCode::FAILURE);
    }
    finish(results, ExitCode::SUCCESS)
}

/// Why `levee apply` does not write `e` without `--override-profile`.
fn refused_for_profile(e: &Entry, p: &ActiveProfile) -> String {
    format!(
        "{}/{}: not applied: it would undo {} set by the active emergency profile {} (until {}); revert \
         the profile first (levee profile revert {} --reason …), or pass --override-profile REASON to \
         write it anyway",
        e.environment,
        e.service,
        p.undoes.join(", "),
        p.name,
        p.expires_at,
        e.environment
    )
}

#[derive(Deserialize)]
struct Written {
    revision: u64,
    /// The staged rollout the write started, if any.
    #[serde(default)]
    rollout: Option<StartedRollout>,
}

#[derive(Deserialize)]
struct StartedRollout {
    id: i64,
}

/// Writes one entry of the plan, based on the revision the plan saw (`override_profile`:
/// why it may undo what the active emergency profile set): what was done, and the
/// service's new revision (none for a prune).
async fn write(
    api: &Api,
    e: &Entry,
    m: Option<&ServiceManifest>,
    reason: &str,
    override_profile: Option<&str>,
    staged: Option<bool>,
) -> Result<(String, Option<u64>), CliError> {
    let path = service_path(&e.environment, &e.service);
    let missing = || {
        CliError::Usage(format!("the plan names {}/{}, which no manifest holds", e.environment, e.service))
    };
    match e.action.as_str() {
        "create" => {
            let m = m.ok_or_else(missing)?;
            let body = json!({"name": m.service, "description": m.description, "policy": m.policy,
                              "flags": m.flags, "reason": reason});
            let w: Written = api
                .send(
                    Method::POST,
                    &format!("/environments/{}/services", seg(&e.environment)),
                    Some(&body),
                    None,
                )
                .await?;
            Ok((format!("created (revision {})", w.revision), Some(w.revision)))
        }
        "change" => {
            let m = m.ok_or_else(missing)?;
            let mut body =
                json!({"description": m.description, "policy": m.policy, "flags": m.flags, "reason": reason});
            if let Some(why) = override_profile {
                body["override_profile"] = json!(why);
            }
            if let Some(staged) = staged {
                body["staged"] = json!(staged);
            }
            let w: Written =
                api.send(Method::PUT, &path, Some(&body), e.revision).await.map_err(conflict_hint)?;
            match w.rollout {
                Some(r) => Ok((
                    format!(
                        "changed (revision {}), staged: rollout {} serves it to its cohort first (levee rollout \
                         status {}/{})",
                        w.revision, r.id, e.environment, e.service
                    ),
                    Some(w.revision),
                )),
                None => Ok((format!("changed (revision {})", w.revision), Some(w.revision))),
            }
        }
        _ => {
            let encode = |text: &str| form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>();
            let mut query = format!("reason={}", encode(reason));
            if let Some(why) = override_profile {
                query.push_str(&format!("&override_profile={}", encode(why)));
            }
            let _: Value = api
                .send(Method::DELETE, &format!("{path}?{query}"), None, e.revision)
                .await
                .map_err(conflict_hint)?;
            Ok(("pruned".to_string(), None))
        }
    }
}

/// A 409 means the service changed after the plan was made: say what to do.
fn conflict_hint(e: CliError) -> CliError {
    match e {
        CliError::Api { what, status: StatusCode::CONFLICT, detail, errors, current_revision } => {
            CliError::Api {
                what,
                status: StatusCode::CONFLICT,
                detail: format!(
                    "{detail}; someone changed the service after the plan: run levee apply again to see the new plan"
                ),
                errors,
                current_revision,
            }
        }
        other => other,
    }
}
