//! The real `levee` binary: `levee import` prints the manifest on stdout and the report on
//! stderr.

use std::process::Command;

use levee_server::manifest;

use super::corpus_dir;

fn levee() -> Command {
    Command::new(env!("CARGO_BIN_EXE_levee"))
}

#[test]
fn levee_import_prints_a_manifest_and_a_report() {
    let file = corpus_dir().join(
        "istio/redhat-scholars__istio-tutorial__istiofiles__virtual-service-recommendation-v2_retry.yml",
    );
    let out = levee()
        .args(["import", "--from", "istio", "--environment", "staging", "--service", "customer"])
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    let ms = manifest::parse("stdout", &stdout).unwrap_or_else(|e| panic!("{e}\n{stdout}"));
    assert_eq!(ms.len(), 1);
    assert_eq!(ms[0].key(), "staging/customer");
    assert_eq!(ms[0].policy.dependencies["recommendation"].retry.max_attempts, 4);
    assert!(stderr.contains("7 settings, 3 mapped, 4 not mapped"), "{stderr}");
    assert!(stderr.contains("spec.http[0].retries.attempts = 3"), "{stderr}");
    assert!(stderr.contains("-> policy.dependencies.recommendation.retry.max_attempts = 4"), "{stderr}");
}

#[test]
fn levee_import_json_output_and_json_report() {
    let file = corpus_dir().join(
        "sentinel/alibaba__spring-cloud-alibaba__spring-cloud-alibaba-starters__spring-cloud-starter-alibaba-sentinel__src__test__resources__system.json",
    );
    let out = levee()
        .args(["import", "--from", "sentinel", "--output", "json", "--report", "json"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let ms = manifest::parse("stdout.json", &stdout).unwrap();
    assert_eq!(ms[0].policy.inbound.limit.initial_limit, 10);
    let report: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(report["source"], "sentinel");
    assert_eq!(report["settings"].as_array().unwrap().len(), 4);
    assert_eq!(report["settings"][3]["outcome"], "mapped");
    assert_eq!(report["settings"][0]["outcome"], "not_mapped");
    assert!(report["warnings"].is_array(), "{report}");
}

#[test]
fn levee_import_reports_what_levee_apply_would_warn_about() {
    let file = corpus_dir().join(
        "resilience4j/resilience4j__resilience4j-spring-boot2-demo__src__main__resources__application.yml",
    );
    let out = levee().args(["import", "--from", "resilience4j"]).arg(&file).output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("\nwarnings (Levee's lints on the imported policy"), "{stderr}");
    assert!(stderr.contains("policy.dependencies.backend-a.retry (retry_exceeds_deadline): "), "{stderr}");
    let out =
        levee().args(["import", "--from", "resilience4j", "--report", "json"]).arg(&file).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
    let codes: Vec<&str> =
        report["warnings"].as_array().unwrap().iter().map(|w| w["code"].as_str().unwrap()).collect();
    assert_eq!(
        codes,
        [
            "retry_exceeds_deadline",
            "timeout_exceeds_budget",
            "retry_exceeds_deadline",
            "timeout_exceeds_budget"
        ]
    );
}

#[test]
fn levee_import_fails_with_the_file_name_on_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.json");
    std::fs::write(&file, "{ not json").unwrap();
    let out = levee().args(["import", "--from", "sentinel"]).arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("rules.json") && stderr.contains("not valid JSON"), "{stderr}");
    assert!(out.stdout.is_empty());

    let out =
        levee().args(["import", "--from", "sentinel"]).arg(dir.path().join("missing.json")).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.json"));
}

/// An Istio file read with `--from envoy` maps nothing: the import warns that the format
/// may be wrong instead of printing an empty manifest in silence.
#[test]
fn a_file_read_as_the_wrong_format_gets_a_warning() {
    let file = corpus_dir().join(
        "istio/redhat-scholars__istio-tutorial__istiofiles__virtual-service-recommendation-v2_retry.yml",
    );
    let out = levee().args(["import", "--from", "envoy"]).arg(&file).output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("0 mapped"), "{stderr}");
    assert!(
        stderr.contains("warning: no setting of") && stderr.contains("--from names its format"),
        "{stderr}"
    );
    let out = levee().args(["import", "--from", "istio"]).arg(&file).output().unwrap();
    assert!(!String::from_utf8(out.stderr).unwrap().contains("warning: no setting"));
}
