//! The real `levee` binary against a real server (port 0, fresh database): login, get,
//! export, apply with its plan and exit codes (the GitOps flow), flip.

#[path = "../shared/backends.rs"]
#[allow(dead_code, unused_macros)]
#[macro_use]
mod backends;
#[path = "../api/helpers.rs"]
#[allow(dead_code)]
mod helpers;

mod docs;

use std::path::Path;

use reqwest::Method;
use serde_json::{Value, json};

use helpers::{ADMIN_PASSWORD, TestApp};

/// What one run of the binary did.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}\n--- stdout\n{}--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

/// Runs `levee ARGS` against `app` with the admin's token in LEVEE_TOKEN (unless `token`
/// says otherwise) and credentials kept in `home`.
async fn levee(app: &TestApp, home: &Path, token: Option<&str>, args: &[&str]) -> Run {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_levee"));
    cmd.args(args)
        .env("LEVEE_SERVER", &app.base)
        .env("LEVEE_CREDENTIALS", home.join("credentials.toml"))
        .env_remove("LEVEE_PASSWORD")
        .env_remove("LEVEE_TOKEN")
        .stdin(std::process::Stdio::null());
    match token {
        Some("") => {}
        Some(t) => {
            cmd.env("LEVEE_TOKEN", t);
        }
        None => {
            cmd.env("LEVEE_TOKEN", &app.token);
        }
    }
    let out = cmd.output().await.expect("the levee binary runs");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn seed_env(app: &TestApp, name: &str) {
    let (s, _, b) =
        app.call(Method::POST, "/api/v1/environments", Some(json!({"name": name, "reason": "test"}))).await;
    assert!(s.is_success(), "{b}");
}

const TWO_SERVICES: &str = r#"api_version: levee/v1
environment: prod
service: checkout
description: Takes orders
policy:
  dependencies:
    pricing:
      attempt_timeout: 250ms
      retry: { max_attempts: 3 }
    recommendations:
      criticality: non_critical
      attempt_timeout: 80ms
      fallback: generic
      enabled_flag: recommendations.enabled
flags:
  recommendations.enabled: { type: bool, value: true, description: kill switch }
---
api_version: levee/v1
environment: prod
service: pricing
policy:
  dependencies:
    db: { attempt_timeout: 100ms, retry: { max_attempts: 2 } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_flow_export_edit_dry_run_apply_apply_again_and_prune() {
    let app = TestApp::spawn().await;
    seed_env(&app, "prod").await;
    let home = tempfile::tempdir().unwrap();
    let repo = tempfile::tempdir().unwrap();
    let first = repo.path().join("bootstrap.yaml");
    std::fs::write(&first, TWO_SERVICES).unwrap();
    let first = first.to_str().unwrap();

    // Bootstrap: the plan creates both and warns about the chain of retries.
    let r =
        levee(&app, home.path(), None, &["apply", "-f", first, "--reason", "bootstrap", "--dry-run"]).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stdout.contains("+ prod/checkout") && r.stdout.contains("+ prod/pricing"), "{r:?}");
    assert!(r.stdout.contains("[retries_on_several_layers]"), "lints appear in the plan: {r:?}");
    assert!(r.stdout.contains("Plan: 2 to create, 0 to change, 0 unchanged."), "{r:?}");
    let (_, _, list) = app.call(Method::GET, "/api/v1/environments/prod/services", None).await;
    assert_eq!(list, json!([]), "a dry run writes nothing");
    let r = levee(&app, home.path(), None, &["apply", "-f", first, "--reason", "bootstrap"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("prod/checkout: created (revision 1)"), "{r:?}");

    // Export the environment into the repository, one file per service.
    let dir = repo.path().join("prod");
    let r = levee(&app, home.path(), None, &["export", "prod", "--dir", dir.to_str().unwrap()]).await;
    assert_eq!(r.code, 0, "{r:?}");
    let exported = std::fs::read_to_string(dir.join("checkout.yaml")).unwrap();
    let ms = levee_server::manifest::parse("checkout.yaml", &exported).unwrap();
    assert_eq!((ms[0].key(), ms[0].description.as_str()), ("prod/checkout".into(), "Takes orders"));
    let r = levee(
        &app,
        home.path(),
        None,
        &["apply", "-f", dir.to_str().unwrap(), "--reason", "noop", "--dry-run"],
    )
    .await;
    assert_eq!(r.code, 0, "an export applies as nothing to do: {r:?}");
    assert!(r.stdout.contains("Nothing to do."), "{r:?}");

    // Edit in the repository; the dry run (the PR check) shows the diff and exits 2.
    let edited = exported
        .replace("attempt_timeout: 250ms", "attempt_timeout: 200ms")
        .replace("value: true", "value: false");
    assert_ne!(edited, exported);
    std::fs::write(dir.join("checkout.yaml"), &edited).unwrap();
    let dir = dir.to_str().unwrap();
    let r = levee(&app, home.path(), None, &["apply", "-f", dir, "--reason", "PR #7", "--dry-run"]).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stdout.contains("~ prod/checkout  changed (revision 1)"), "{r:?}");
    assert!(
        r.stdout.contains(r#"~ policy.dependencies.pricing.attempt_timeout: "250ms" → "200ms""#),
        "{r:?}"
    );
    assert!(r.stdout.contains("~ flags.recommendations.enabled.value: true → false"), "{r:?}");
    assert!(r.stdout.contains("= prod/pricing"), "{r:?}");
    assert!(r.stdout.contains("Plan: 0 to create, 1 to change, 1 unchanged."), "{r:?}");

    // Merge: apply (exit 0), one revision with both changes, audited via the CLI.
    let r = levee(&app, home.path(), None, &["apply", "-f", dir, "--reason", "PR #7 merged"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("prod/checkout: changed (revision 2)"), "{r:?}");
    let (_, _, snap) =
        app.call(Method::GET, "/api/v1/environments/prod/services/checkout/snapshot", None).await;
    assert_eq!(snap["revision"], 2);
    assert_eq!(snap["config"]["policy"]["dependencies"]["pricing"]["attempt_timeout"], "200ms");
    assert_eq!(snap["config"]["flags"]["recommendations.enabled"]["value"], false);
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?service=checkout&limit=1", None).await;
    assert_eq!(
        (&audit[0]["action"], &audit[0]["via"], &audit[0]["reason"]),
        (&json!("service.apply"), &json!("cli"), &json!("PR #7 merged")),
        "{audit}"
    );

    // Again: nothing to do, exit 0, no new revision.
    let r = levee(&app, home.path(), None, &["apply", "-f", dir, "--reason", "PR #7 merged"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("Nothing to do."), "{r:?}");

    // A service removed from the repository stays without --prune, goes with it.
    std::fs::remove_file(Path::new(dir).join("pricing.yaml")).unwrap();
    let r =
        levee(&app, home.path(), None, &["apply", "-f", dir, "--reason", "drop pricing", "--dry-run"]).await;
    assert_eq!(r.code, 0, "without --prune nothing changes: {r:?}");
    assert!(r.stdout.contains("? prod/pricing") && r.stdout.contains("--prune deletes them"), "{r:?}");
    let r = levee(
        &app,
        home.path(),
        None,
        &["apply", "-f", dir, "--reason", "drop pricing", "--prune", "--dry-run"],
    )
    .await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stdout.contains("- prod/pricing   would be pruned (revision 1)"), "{r:?}");
    let r =
        levee(&app, home.path(), None, &["apply", "-f", dir, "--reason", "drop pricing", "--prune"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("prod/pricing: pruned"), "{r:?}");
    let (_, _, list) = app.call(Method::GET, "/api/v1/environments/prod/services", None).await;
    let names: Vec<&str> = list.as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["checkout"]);
    let r =
        levee(&app, home.path(), None, &["apply", "-f", dir, "--reason", "drop pricing", "--prune"]).await;
    assert_eq!((r.code, r.stdout.contains("Nothing to do.")), (0, true), "{r:?}");

    // A re-export over a directory that still holds the file of a deleted service warns of
    // it: the next apply would create the service again.
    std::fs::write(Path::new(dir).join("pricing.yaml"), TWO_SERVICES.split("---\n").nth(1).unwrap()).unwrap();
    let r = levee(&app, home.path(), None, &["export", "prod", "--dir", dir]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.contains("pricing.yaml holds prod/pricing, which the server does not have: delete the file"),
        "{r:?}"
    );
    std::fs::remove_file(Path::new(dir).join("pricing.yaml")).unwrap();

    // Bringing it back continues its revisions (its agents hold revision 1).
    let r = levee(&app, home.path(), None, &["apply", "-f", first, "--reason", "pricing is back"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("prod/pricing: created (revision 2)"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_file_the_yaml_path_and_the_allowed_range() {
    let app = TestApp::spawn().await;
    seed_env(&app, "prod").await;
    let home = tempfile::tempdir().unwrap();
    let repo = tempfile::tempdir().unwrap();
    let bad = repo.path().join("bad.yaml");
    std::fs::write(&bad, TWO_SERVICES.replace("max_attempts: 3", "max_attempts: 30")).unwrap();
    let r = levee(&app, home.path(), None, &["apply", "-f", bad.to_str().unwrap(), "--reason", "x"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr.contains(
            "bad.yaml:9:30: document 1 (prod/checkout): policy.dependencies.pricing.retry.max_attempts"
        ) && r.stderr.contains("between 1 and 10")
            && r.stderr.contains("(got 30)"),
        "{r:?}"
    );
    // A decoding error has its line; a duration that does not parse says what is accepted.
    std::fs::write(&bad, TWO_SERVICES.replace("attempt_timeout: 80ms", "attempt_timeout: 80")).unwrap();
    let r = levee(&app, home.path(), None, &["apply", "-f", bad.to_str().unwrap(), "--reason", "x"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("bad.yaml:12:") && r.stderr.contains(r#""250ms", "1.5s""#), "{r:?}");
    // A wrong type names the range (not "invalid u32"), and the other bad fields of the
    // file are listed with it.
    std::fs::write(
        &bad,
        TWO_SERVICES.replace("max_attempts: 3", "max_attempts: -1").replace(
            "attempt_timeout: 100ms, retry: { max_attempts: 2 }",
            "attempt_timeout: 100ms, retry: { max_attempts: 20 }",
        ),
    )
    .unwrap();
    let r = levee(&app, home.path(), None, &["apply", "-f", bad.to_str().unwrap(), "--reason", "x"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr.contains(
            "bad.yaml:9:30: document 1 (prod/checkout): policy.dependencies.pricing.retry.max_attempts: invalid \
             value: integer `-1`, expected a whole number; must be between 1 and 10 (got -1)"
        ),
        "{r:?}"
    );
    assert!(
        r.stderr.contains(
            "bad.yaml:23:58: document 2 (prod/pricing): policy.dependencies.db.retry.max_attempts: must be between 1 and 10 (got 20)"
        ),
        "{r:?}"
    );
    // What only the server knows (the environment) is located in the file too.
    std::fs::write(
        &bad,
        TWO_SERVICES.replace("environment: prod\nservice: pricing", "environment: staging\nservice: pricing"),
    )
    .unwrap();
    let r = levee(&app, home.path(), None, &["apply", "-f", bad.to_str().unwrap(), "--reason", "x"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr.contains("bad.yaml: document 2 (staging/pricing): environment: no environment \"staging\""),
        "{r:?}"
    );
    // The same service in two files.
    std::fs::write(repo.path().join("again.yaml"), TWO_SERVICES).unwrap();
    std::fs::write(&bad, TWO_SERVICES).unwrap();
    let r = levee(&app, home.path(), None, &["apply", "-f", repo.path().to_str().unwrap(), "--reason", "x"])
        .await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr.contains("bad.yaml: document 1 (prod/checkout): the same service as")
            && r.stderr.contains("again.yaml"),
        "{r:?}"
    );
    // No reason, no apply.
    let r = levee(&app, home.path(), None, &["apply", "-f", bad.to_str().unwrap()]).await;
    assert_eq!(r.code, 1, "a usage error is an error, never 2 (changes): {r:?}");
    assert!(r.stderr.contains("--reason"), "{r:?}");
    let (_, _, list) = app.call(Method::GET, "/api/v1/environments/prod/services", None).await;
    assert_eq!(list, json!([]), "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_keeps_the_token_in_a_0600_file_and_levee_token_wins() {
    use std::os::unix::fs::PermissionsExt;
    let app = TestApp::spawn().await;
    seed_env(&app, "prod").await;
    let home = tempfile::tempdir().unwrap();
    let file = home.path().join("credentials.toml");

    let r = levee(&app, home.path(), Some(""), &["get", "prod"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("401") && r.stderr.contains("levee login"), "{r:?}");

    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_levee"));
    let out = cmd
        .args(["login", "--server", &app.base, "--credentials", file.to_str().unwrap()])
        .env("LEVEE_PASSWORD", ADMIN_PASSWORD)
        .env_remove("LEVEE_SERVER")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the token file is the user's alone");
    let saved: toml::Value = toml::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved["server"].as_str(), Some(app.base.as_str()));

    // The saved token works without LEVEE_TOKEN; a bad LEVEE_TOKEN wins over it.
    let r = levee(&app, home.path(), Some(""), &["get", "prod"]).await;
    assert_eq!((r.code, r.stdout.as_str()), (0, ""), "an empty environment prints nothing: {r:?}");
    let r = levee(&app, home.path(), Some("not-a-token"), &["get", "prod"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("401"), "{r:?}");

    // A file others can read is pointed out.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let r = levee(&app, home.path(), Some(""), &["get", "prod"]).await;
    assert!(r.stderr.contains("other users can read it") && r.stderr.contains("chmod 600"), "{r:?}");

    // A wrong password: exit 1, nothing saved over the old token.
    let before = std::fs::read_to_string(&file).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_levee"))
        .args(["login", "--server", &app.base, "--credentials", file.to_str().unwrap()])
        .env("LEVEE_PASSWORD", "wrong-password-123")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flip_reads_the_flag_type_and_writes_with_if_match() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let home = tempfile::tempdir().unwrap();
    let flip = |value: &'static str, extra: &'static [&'static str]| {
        let app = &app;
        let home = home.path().to_path_buf();
        async move {
            let mut args =
                vec!["flip", "prod/checkout", "recommendations.enabled", value, "--reason", "incident 12"];
            args.extend_from_slice(extra);
            levee(app, &home, None, &args).await
        }
    };
    let r = flip("false", &["--for", "30m"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.stdout.trim(), "prod/checkout: recommendations.enabled = false (revision 2)");
    let (_, _, flag) = app
        .call(Method::GET, "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled", None)
        .await;
    assert_eq!(flag["value"], false);
    let expires = levee_agent::policy::Timestamp::parse(flag["expires_at"].as_str().unwrap()).unwrap();
    let left = expires.unix_ms() - levee_agent::policy::Timestamp::now().unix_ms();
    assert!((29 * 60_000..=30 * 60_000).contains(&left), "expires in {left} ms");
    // Without --for the value becomes permanent: the expiry of the first flip is removed
    // (it would otherwise remove the settled switch later), then nothing is left to change.
    let r = flip("false", &[]).await;
    assert_eq!(r.stdout.trim(), "prod/checkout: recommendations.enabled = false (revision 3)", "{r:?}");
    let (_, _, flag) = app
        .call(Method::GET, "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled", None)
        .await;
    assert_eq!(flag["expires_at"], Value::Null, "{flag}");
    let r = flip("false", &[]).await;
    assert_eq!(r.stdout.trim(), "prod/checkout: recommendations.enabled = false (it already was)", "{r:?}");
    let r = flip("off", &[]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("bool flag: the value must be true or false (got \"off\")"), "{r:?}");
    let r = levee(&app, home.path(), None, &["flip", "prod/checkout", "nope", "true", "--reason", "x"]).await;
    assert!(r.code == 1 && r.stderr.contains("its flags: recommendations.enabled"), "{r:?}");
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?service=checkout&limit=1", None).await;
    assert_eq!((&audit[0]["via"], &audit[0]["reason"]), (&json!("cli"), &json!("incident 12")), "{audit}");
    let _: Value = audit;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_apply_and_revert_from_the_command_line() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, _, b) = app
        .call(
            Method::PUT,
            "/api/v1/environments/prod/profiles/recs-down",
            Some(json!({"services": {"checkout": {"flags": {"recommendations.enabled": false}}}, "reason": "agreed"})),
        )
        .await;
    assert!(s.is_success(), "{b}");
    let home = tempfile::tempdir().unwrap();
    let r = levee(
        &app,
        home.path(),
        None,
        &["profile", "apply", "prod", "recs-down", "--for", "2h", "--reason", "INC-7 recommendations down"],
    )
    .await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.starts_with("prod: profile recs-down (version 1) applied to checkout until "), "{r:?}");
    let (_, _, active) = app.call(Method::GET, "/api/v1/environments/prod/active-profile", None).await;
    assert_eq!(
        (&active["applied_by"], &active["reason"]),
        (&json!("admin"), &json!("INC-7 recommendations down"))
    );
    let expires = levee_agent::policy::Timestamp::parse(active["expires_at"].as_str().unwrap()).unwrap();
    let left = expires.unix_ms() - levee_agent::policy::Timestamp::now().unix_ms();
    assert!((119 * 60_000..=120 * 60_000).contains(&left), "expires in {left} ms");

    // A second application is refused with the reason; a bad duration never reaches the server.
    let r = levee(
        &app,
        home.path(),
        None,
        &["profile", "apply", "prod", "recs-down", "--for", "1h", "--reason", "again"],
    )
    .await;
    assert!(r.code == 1 && r.stderr.contains("is active in environment \"prod\""), "{r:?}");
    let r = levee(
        &app,
        home.path(),
        None,
        &["profile", "apply", "prod", "recs-down", "--for", "soon", "--reason", "x"],
    )
    .await;
    assert!(r.code == 1 && r.stderr.contains("invalid duration \"soon\""), "{r:?}");

    let r = levee(&app, home.path(), None, &["profile", "revert", "prod", "--reason", "recovered"]).await;
    assert_eq!((r.code, r.stdout.trim()), (0, "prod: profile recs-down reverted in checkout"), "{r:?}");
    let (_, _, flag) = app
        .call(Method::GET, "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled", None)
        .await;
    assert_eq!(flag["value"], true);
    let r = levee(&app, home.path(), None, &["profile", "revert", "prod", "--reason", "again"]).await;
    assert!(r.code == 1 && r.stderr.contains("no profile is active"), "{r:?}");
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?environment=prod&limit=1", None).await;
    assert_eq!((&audit[0]["action"], &audit[0]["via"]), (&json!("profile.revert"), &json!("cli")), "{audit}");
}

/// After `flip … --for`, the expiry puts back the flag git declares (deleting it would make
/// the unchanged git directory plan a change in every later dry run), and get/export
/// write the declared flag, never the temporary one, and name the flip on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flip_for_a_while_ends_as_git_declares_it_and_is_never_exported() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let home = tempfile::tempdir().unwrap();
    let repo = tempfile::tempdir().unwrap();
    let git = repo.path().join("git");
    let r = levee(&app, home.path(), None, &["export", "prod", "--dir", git.to_str().unwrap()]).await;
    assert_eq!((r.code, r.stderr.as_str()), (0, ""), "{r:?}");
    let declared = std::fs::read_to_string(git.join("checkout.yaml")).unwrap();
    let dry_run = ["apply", "-f", git.to_str().unwrap(), "--reason", "PR check", "--dry-run"];

    let flip =
        ["flip", "prod/checkout", "recommendations.enabled", "false", "--reason", "inc", "--for", "30m"];
    let r = levee(&app, home.path(), None, &flip).await;
    assert_eq!(r.code, 0, "{r:?}");
    let (_, _, flag) = app
        .call(Method::GET, "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled", None)
        .await;
    let until = flag["expires_at"].as_str().unwrap().to_string();

    // During the flip: export writes what git declares, and says what it left out.
    let during = repo.path().join("during");
    let r = levee(&app, home.path(), None, &["export", "prod", "--dir", during.to_str().unwrap()]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(std::fs::read_to_string(during.join("checkout.yaml")).unwrap(), declared, "{r:?}");
    let note = format!(
        "note: prod/checkout: flag recommendations.enabled is temporarily false until {until}; not exported: \
         the manifest has the flag it goes back to then (true)"
    );
    assert_eq!(r.stderr.trim(), note, "{r:?}");
    let r = levee(&app, home.path(), None, &["get", "prod/checkout"]).await;
    assert_eq!((r.code, r.stdout.as_str(), r.stderr.trim()), (0, declared.as_str(), note.as_str()), "{r:?}");

    // During the flip, the unchanged directory plans nothing; a merge of an unrelated
    // change keeps the flip (it must not switch the kill switch back on); a merge
    // that changes the flag changes what it goes back to, and says so.
    let r = levee(&app, home.path(), None, &dry_run).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("Nothing to do."), "{r:?}");
    let flag_now = || async {
        let (_, _, f) = app
            .call(
                Method::GET,
                "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled",
                None,
            )
            .await;
        f
    };
    std::fs::write(
        git.join("checkout.yaml"),
        declared.replacen("description: \"\"", "description: merged", 1),
    )
    .unwrap();
    let merged = std::fs::read_to_string(git.join("checkout.yaml")).unwrap();
    assert_ne!(merged, declared, "the test changes the description");
    let apply = ["apply", "-f", git.to_str().unwrap(), "--reason", "merge"];
    let r = levee(&app, home.path(), None, &apply).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(flag_now().await["value"], json!(false), "the flip stays in force: {r:?}");
    std::fs::write(
        git.join("checkout.yaml"),
        merged.replace("description: kill switch", "description: the kill switch"),
    )
    .unwrap();
    let r = levee(&app, home.path(), None, &dry_run).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stdout.contains(&format!(
            "! flag recommendations.enabled is temporarily false until {until}: it stays so (a flip with --for); \
             then it goes back to true, as the manifest says"
        )),
        "{r:?}"
    );
    let r = levee(&app, home.path(), None, &apply).await;
    assert_eq!(r.code, 0, "{r:?}");
    let f = flag_now().await;
    assert_eq!((&f["value"], &f["description"]), (&json!(false), &json!("kill switch")), "{f}");
    let declared = std::fs::read_to_string(git.join("checkout.yaml")).unwrap();
    // That write made no revision (agents get nothing new): the service's revision and
    // its snapshot still agree, and the plan of the directory has nothing left to do.
    let (s, _, snap) =
        app.call(Method::GET, "/api/v1/environments/prod/services/checkout/snapshot", None).await;
    let (_, _, svc) = app.call(Method::GET, "/api/v1/environments/prod/services/checkout", None).await;
    assert_eq!((s.as_u16(), &snap["revision"]), (200, &svc["revision"]), "{snap} {svc}");
    let r = levee(&app, home.path(), None, &dry_run).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("Nothing to do."), "{r:?}");
    // It is audited all the same: what the flag goes back to, before and after.
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?service=checkout&limit=1", None).await;
    let row = &audit[0];
    assert_eq!((&row["action"], &row["reason"]), (&json!("service.apply"), &json!("merge")), "{audit}");
    assert_eq!(
        row["before"]["goes_back_to"]["recommendations.enabled"]["description"],
        json!("kill switch"),
        "{audit}"
    );
    assert_eq!(
        row["after"]["goes_back_to"]["recommendations.enabled"]["description"],
        json!("the kill switch"),
        "{audit}"
    );
    assert_eq!(row["revision"], svc["revision"], "{audit}");

    // The expiry (driven by calling the sweeper's action with a later instant) puts the
    // flag back: the unchanged git directory plans nothing, and get shows git's flag.
    let later = levee_agent::policy::Timestamp::parse(&until).unwrap().unix_ms() + 1000;
    let actions = &app.server.as_ref().unwrap().actions;
    let expired = actions.expire(levee_agent::policy::Timestamp::from_unix_ms(later)).await.unwrap();
    assert_eq!(expired, 1);
    let r = levee(&app, home.path(), None, &dry_run).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("Nothing to do."), "{r:?}");
    let r = levee(&app, home.path(), None, &["get", "prod/checkout"]).await;
    assert_eq!((r.code, r.stdout.as_str(), r.stderr.as_str()), (0, declared.as_str(), ""), "{r:?}");
}

/// `profile revert` says what it left as it was (changed since the profile set it), as the
/// audit row does; it printed only the services.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_revert_prints_what_it_left_as_it_is() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, _, b) = app
        .call(
            Method::PUT,
            "/api/v1/environments/prod/profiles/recs-down",
            Some(json!({"services": {"checkout": {"flags": {"recommendations.enabled": false},
                "breakers": [{"dependency": "recommendations", "state": "forced_open"}]}}, "reason": "agreed"})),
        )
        .await;
    assert!(s.is_success(), "{b}");
    let home = tempfile::tempdir().unwrap();
    let apply = ["profile", "apply", "prod", "recs-down", "--for", "2h", "--reason", "INC-8"];
    assert_eq!(levee(&app, home.path(), None, &apply).await.code, 0);
    let flip = ["flip", "prod/checkout", "recommendations.enabled", "true", "--reason", "back already"];
    assert_eq!(levee(&app, home.path(), None, &flip).await.code, 0);
    let r = levee(&app, home.path(), None, &["profile", "revert", "prod", "--reason", "recovered"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        r.stdout,
        "prod: profile recs-down reverted in checkout\n  \
         checkout: flag recommendations.enabled changed since the profile set it; left as it is\n",
        "{r:?}"
    );
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?service=checkout&limit=1", None).await;
    assert_eq!(
        audit[0]["detail"],
        json!(
            "flag recommendations.enabled changed since the profile set it; left as it is; \
               breaker override recommendations restored"
        ),
        "{audit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_glass_applies_where_approval_is_required_and_is_audited_as_a_bypass() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, _, b) = app
        .call(
            Method::PUT,
            "/api/v1/environments/prod/approval-rules",
            Some(json!({"kinds": ["flag"], "reason": "SOC 2"})),
        )
        .await;
    assert!(s.is_success(), "{b}");
    let home = tempfile::tempdir().unwrap();
    let flip = ["flip", "prod/checkout", "recommendations.enabled", "false", "--reason", "INC-9"];
    let r = levee(&app, home.path(), None, &flip).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("need an approved change request"), "{r:?}");
    let r = levee(&app, home.path(), None, &[&flip[..], &["--break-glass", "  "]].concat()).await;
    assert!(r.code == 1 && r.stderr.contains("--break-glass needs a reason"), "{r:?}");
    let r =
        levee(&app, home.path(), None, &[&flip[..], &["--break-glass", "checkout is down"]].concat()).await;
    assert_eq!(r.code, 0, "{r:?}");
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?environment=prod&limit=2", None).await;
    // The bypass is recorded once the change it bypassed is made, naming its revision.
    assert_eq!(audit[1]["action"], "flag.set", "{audit}");
    assert_eq!(
        (&audit[0]["action"], &audit[0]["reason"], &audit[0]["via"]),
        (&json!("approval.bypass"), &json!("checkout is down"), &json!("cli")),
        "{audit}"
    );
    assert_eq!(audit[0]["revision"], audit[1]["revision"], "{audit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_warns_of_an_active_profile_and_undoes_it_only_when_told() {
    let app = TestApp::spawn().await;
    seed_env(&app, "prod").await;
    let home = tempfile::tempdir().unwrap();
    let repo = tempfile::tempdir().unwrap();
    let file = repo.path().join("prod.yaml");
    std::fs::write(&file, TWO_SERVICES).unwrap();
    let file = file.to_str().unwrap();
    let r = levee(&app, home.path(), None, &["apply", "-f", file, "--reason", "bootstrap"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    let (s, _, b) = app
        .call(
            Method::PUT,
            "/api/v1/environments/prod/profiles/recs-down",
            Some(json!({"services": {"checkout": {"flags": {"recommendations.enabled": false}}}, "reason": "agreed"})),
        )
        .await;
    assert!(s.is_success(), "{b}");
    let r = levee(
        &app,
        home.path(),
        None,
        &["profile", "apply", "prod", "recs-down", "--for", "2h", "--reason", "INC-7 recommendations down"],
    )
    .await;
    assert_eq!(r.code, 0, "{r:?}");
    const FLAG: &str = "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled";

    // The plan says the profile is active and what the apply would undo; the dry run
    // fails as the apply would (a PR check must not pass where the merge job fails), and
    // with --override-profile it shows changes (2). A dry run needs no --reason.
    let r = levee(&app, home.path(), None, &["apply", "-f", file, "--dry-run"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr.contains("prod/checkout: not applied: it would undo flags.recommendations.enabled"),
        "{r:?}"
    );
    let dry_override = ["apply", "-f", file, "--dry-run", "--override-profile", "INC-7 fixed upstream"];
    assert_eq!(levee(&app, home.path(), None, &dry_override).await.code, 2);
    assert!(r.stdout.contains("~ flags.recommendations.enabled.value: false → true"), "{r:?}");
    // The expiry the profile set is shown as taken away (it read `"…" → (none)`).
    assert!(r.stdout.contains("    - flags.recommendations.enabled.expires_at: \""), "{r:?}");
    assert!(
        r.stdout.contains("! emergency profile recs-down (applied by admin) is active until ")
            && r.stdout
                .contains(": this apply would undo flags.recommendations.enabled (set by the profile)"),
        "{r:?}"
    );

    // Apply refuses that service, says how to proceed, and leaves the kill switch off.
    let r = levee(&app, home.path(), None, &["apply", "-f", file, "--reason", "merge"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr.contains("prod/checkout: not applied: it would undo flags.recommendations.enabled set by the active emergency profile recs-down")
            && r.stderr.contains("levee profile revert prod")
            && r.stderr.contains("--override-profile REASON"),
        "{r:?}"
    );
    let (_, _, flag) = app.call(Method::GET, FLAG, None).await;
    assert_eq!(flag["value"], false, "{flag}");

    // With --override-profile it writes, and the audit says why.
    let r = levee(
        &app,
        home.path(),
        None,
        &["apply", "-f", file, "--reason", "merge", "--override-profile", "INC-7 fixed upstream"],
    )
    .await;
    assert_eq!(r.code, 0, "{r:?}");
    let (_, _, flag) = app.call(Method::GET, FLAG, None).await;
    assert_eq!(flag["value"], true, "{flag}");
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?environment=prod&limit=1", None).await;
    assert_eq!(
        audit[0]["reason"], "merge (overrides emergency profile recs-down: INC-7 fixed upstream)",
        "{audit}"
    );
}

/// `-o json` prints one document a CI job can read: the server's whole plan (no value cut
/// short) and what became of each write; the exit codes stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_output_json_gives_the_whole_plan_and_the_results() {
    let app = TestApp::spawn().await;
    seed_env(&app, "prod").await;
    let home = tempfile::tempdir().unwrap();
    let repo = tempfile::tempdir().unwrap();
    let file = repo.path().join("svc.yaml");
    std::fs::write(&file, TWO_SERVICES).unwrap();
    let file = file.to_str().unwrap();
    let r = levee(
        &app,
        home.path(),
        None,
        &["apply", "-f", file, "--reason", "bootstrap", "-o", "json", "--dry-run"],
    )
    .await;
    assert_eq!(r.code, 2, "{r:?}");
    let doc: Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {r:?}"));
    assert_eq!(doc["dry_run"], json!(true));
    assert_eq!(doc["results"], json!([]));
    let actions: Vec<&str> =
        doc["plan"]["services"].as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["create", "create"]);

    let r =
        levee(&app, home.path(), None, &["apply", "-f", file, "--reason", "bootstrap", "-o", "json"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    let doc: Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {r:?}"));
    assert_eq!(
        doc["results"],
        json!([
            {"service": "prod/checkout", "action": "create", "revision": 1},
            {"service": "prod/pricing", "action": "create", "revision": 1},
        ])
    );

    // A long value (a whole new dependency) is shown in full in the text plan.
    let long_description = "x".repeat(300);
    std::fs::write(
        repo.path().join("svc.yaml"),
        TWO_SERVICES.replace("description: Takes orders", &format!("description: {long_description}")),
    )
    .unwrap();
    let r = levee(&app, home.path(), None, &["apply", "-f", file, "--reason", "long", "--dry-run"]).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stdout.contains(&format!("~ description: \"Takes orders\" → \"{long_description}\"")), "{r:?}");

    // An invalid file still gives a CI job a JSON document on stdout (and exit 1).
    std::fs::write(repo.path().join("svc.yaml"), TWO_SERVICES.replace("max_attempts: 3", "max_attempts: 30"))
        .unwrap();
    let r = levee(&app, home.path(), None, &["apply", "-f", file, "--dry-run", "-o", "json"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    let doc: Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {r:?}"));
    assert!(
        doc["error"].as_str().unwrap().contains("retry.max_attempts: must be between 1 and 10 (got 30)"),
        "{doc}"
    );
    assert_eq!(doc["plan"], Value::Null);
}

/// CD-3: `levee get` and `levee flip` on a service whose current revision no longer
/// decodes (stored by another version) say which revision cannot be read and that a
/// rollback replaces it, exit 1, and never report a server error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cd_3_get_and_flip_of_an_undecodable_revision_say_so() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let deep = format!("{}{}", "[".repeat(126), "]".repeat(126));
    let revision = app
        .store_raw_revision(&format!(r#"{{"flags": {{"d": {{"type": "json", "value": {deep}}}}}}}"#))
        .await;
    let home = tempfile::tempdir().unwrap();
    for args in [
        &["get", "prod/checkout"][..],
        &["get", "prod"][..],
        &["flip", "prod/checkout", "recommendations.enabled", "false", "--reason", "incident"][..],
    ] {
        let r = levee(&app, home.path(), None, args).await;
        assert_eq!(r.code, 1, "{args:?}: {r:?}");
        assert!(
            r.stderr.contains(&format!("revision {revision} of prod/checkout cannot be read")),
            "{args:?}: {r:?}"
        );
        assert!(r.stderr.contains("roll back"), "{args:?}: {r:?}");
        assert!(!r.stderr.contains("internal") && !r.stderr.contains("500"), "{args:?}: {r:?}");
    }
}

/// `levee tokens`: create writes the secret to a 0600 file (nothing on stdout), rotate by
/// name mints a token of the same scope and leaves the old one working for the overlap,
/// revoke ends it, list hides ended tokens unless --all; mistakes name what to give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_create_rotate_and_revoke_from_the_command_line() {
    use std::os::unix::fs::PermissionsExt;
    let app = TestApp::spawn().await;
    app.seed().await;
    let home = tempfile::tempdir().unwrap();
    let out = home.path().join("secrets").join("checkout-token");
    let out_s = out.to_str().unwrap();
    let r = levee(
        &app,
        home.path(),
        None,
        &[
            "tokens",
            "create",
            "checkout-prod",
            "--environment",
            "prod",
            "--service",
            "checkout",
            "--expires-in",
            "90d",
            "--reason",
            "checkout agents",
            "--out",
            out_s,
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.stdout, "", "the secret goes to the file only: {r:?}");
    assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o600);
    let first = std::fs::read_to_string(&out).unwrap().trim().to_string();
    // The token is an agent token of prod/checkout: the API refuses it.
    let (s, _, _) = app.call_as(&first, Method::GET, "/api/v1/environments", None, &[]).await;
    assert_eq!(s, 401);

    // Rotate by name, the new secret on stdout alone.
    let r = levee(
        &app,
        home.path(),
        None,
        &["tokens", "rotate", "checkout-prod", "--overlap", "2h", "--reason", "drill"],
    )
    .await;
    assert_eq!(r.code, 0, "{r:?}");
    let second = r.stdout.trim().to_string();
    assert!(!second.is_empty() && second != first && !second.contains('\n'), "{r:?}");
    assert!(r.stderr.contains("works until it is revoked"), "{r:?}");
    let (_, _, list) = app.call(Method::GET, "/api/v1/tokens", None).await;
    let named: Vec<&Value> =
        list.as_array().unwrap().iter().filter(|t| t["name"] == "checkout-prod").collect();
    assert_eq!(named.len(), 2, "{list}");
    assert!(
        named.iter().all(|t| t["environment"] == "prod" && t["services"] == json!(["checkout"])),
        "{list}"
    );
    // Two tokens that still work share the name now: the name alone is refused.
    let r = levee(&app, home.path(), None, &["tokens", "revoke", "checkout-prod", "--reason", "x"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("2 tokens that still work are named \"checkout-prod\""), "{r:?}");
    let old_id =
        named.iter().find(|t| !t["revoked_at"].is_null()).unwrap()["id"].as_str().unwrap().to_string();
    let r = levee(&app, home.path(), None, &["tokens", "list"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains(&old_id) && r.stdout.contains("revoked 20"), "{r:?}");
    assert!(!r.stdout.contains("soon") && !r.stderr.contains("expire within"), "{r:?}");
    // A token that expires within 14 days is marked, and counted on stderr.
    let r = levee(
        &app,
        home.path(),
        None,
        &["tokens", "create", "short-lived", "--environment", "prod", "--service", "checkout"],
    )
    .await;
    assert_ne!(r.code, 0, "--reason is required: {r:?}");
    let r = levee(
        &app,
        home.path(),
        None,
        &[
            "tokens",
            "create",
            "short-lived",
            "--environment",
            "prod",
            "--service",
            "checkout",
            "--expires-in",
            "7d",
            "--reason",
            "trial",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{r:?}");
    let r = levee(&app, home.path(), None, &["tokens", "list"]).await;
    let line = r.stdout.lines().find(|l| l.contains("short-lived")).unwrap_or_else(|| panic!("{r:?}"));
    assert!(line.ends_with("(soon: rotate it)"), "{r:?}");
    assert!(r.stderr.contains("1 token(s) expire within 14d"), "{r:?}");

    // Revoke the old one by id: it ends now, and list hides it unless --all.
    let r = levee(&app, home.path(), None, &["tokens", "revoke", &old_id, "--reason", "rotation done"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    let r = levee(&app, home.path(), None, &["tokens", "list"]).await;
    assert!(!r.stdout.contains(&old_id), "{r:?}");
    let r = levee(&app, home.path(), None, &["tokens", "list", "--all"]).await;
    assert!(r.stdout.contains(&old_id) && r.stdout.contains("(ended)"), "{r:?}");
    // Rotating an ended token says to mint one instead; a bad overlap names its range.
    let r = levee(&app, home.path(), None, &["tokens", "rotate", &old_id, "--reason", "again"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("409") && r.stderr.contains("mint a new token"), "{r:?}");
    let r = levee(
        &app,
        home.path(),
        None,
        &["tokens", "rotate", "checkout-prod", "--overlap", "31d", "--reason", "x"],
    )
    .await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("overlap") && r.stderr.contains("between 0s and 30d"), "{r:?}");
}
