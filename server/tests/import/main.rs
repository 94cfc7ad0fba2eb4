//! Importers: every file of the public corpus (tests/data/corpus, see its SOURCES.md),
//! hand-made edge cases, the `levee import` binary, and the examples of docs/importers.md.

mod cli;
mod corpus;
mod docs;
mod edge;

use std::path::PathBuf;

use levee_server::import::{ImportOptions, Imported, Outcome, Source, import};

pub fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/corpus")
}

pub fn import_file(source: Source, rel: &str) -> Imported {
    let path = corpus_dir().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let options = ImportOptions { environment: "prod".into(), service: Some("svc".into()) };
    import(source, rel, &text, &options).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

pub fn import_text(source: Source, text: &str) -> Imported {
    let options = ImportOptions { environment: "prod".into(), service: Some("svc".into()) };
    import(source, "inline", text, &options).unwrap_or_else(|e| panic!("{e}"))
}

/// The Levee fields a setting was mapped to, or panics with its reason.
pub fn mapped_to(i: &Imported, path: &str) -> Vec<String> {
    match &i
        .report
        .setting(path)
        .unwrap_or_else(|| panic!("no setting {path}\n{}", i.report.render()))
        .outcome
    {
        Outcome::Mapped { to } => to.clone(),
        Outcome::NotMapped { reason } => panic!("{path} is not mapped: {reason}"),
    }
}

/// Why a setting was not mapped, or panics.
pub fn reason(i: &Imported, path: &str) -> String {
    match &i
        .report
        .setting(path)
        .unwrap_or_else(|| panic!("no setting {path}\n{}", i.report.render()))
        .outcome
    {
        Outcome::NotMapped { reason } => reason.clone(),
        Outcome::Mapped { to } => panic!("{path} is mapped to {to:?}"),
    }
}
