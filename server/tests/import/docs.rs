//! The examples of docs/importers.md are checked: a block after `<!-- check: manifest -->`
//! must decode and validate as a manifest; a block after `<!-- check: import SOURCE -->` is
//! imported, and the block after the next `<!-- check: output -->` must be contained in the
//! manifest it produced (every key and value it shows, at the same place). A block after
//! `<!-- check: bad-manifest -->` must be refused, with every line of the next
//! `<!-- check: message -->` block in the error (the file named `checkout.yaml`). The lines
//! of a block after `<!-- check: report SOURCE FILE -->` must all appear in the report of
//! that corpus file.

use levee_server::import::{ImportOptions, Source, import};
use levee_server::manifest;

#[path = "../shared/doc_blocks.rs"]
mod doc_blocks;
use doc_blocks::blocks;

fn contained(expected: &serde_json::Value, actual: &serde_json::Value, path: &str) -> Result<(), String> {
    use serde_json::Value;
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, ev) in e {
                let av = a.get(k).ok_or_else(|| format!("{path}.{k} is missing"))?;
                contained(ev, av, &format!("{path}.{k}"))?;
            }
            Ok(())
        }
        (e, a) if e == a => Ok(()),
        (Value::Number(e), Value::Number(a)) if e.as_f64() == a.as_f64() => Ok(()),
        (e, a) => Err(format!("{path}: the docs show {e}, the import gives {a}")),
    }
}

#[test]
fn the_examples_in_docs_importers_md_are_true() {
    let md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/importers.md")).unwrap();
    let blocks = blocks(&md);
    let mut checked = 0;
    let mut last_import: Option<serde_json::Value> = None;
    let mut last_error: Option<String> = None;
    for (kind, body) in &blocks {
        let mut words = kind.split_whitespace();
        match words.next() {
            Some("manifest") => {
                manifest::parse("docs/importers.md", body).unwrap_or_else(|e| panic!("{e}\n{body}"));
                checked += 1;
            }
            Some("import") => {
                let source: Source = clap::ValueEnum::from_str(words.next().unwrap(), true).unwrap();
                let options = ImportOptions { environment: "prod".into(), service: Some("checkout".into()) };
                let i = import(source, "example", body, &options).unwrap_or_else(|e| panic!("{e}\n{body}"));
                i.manifest.validate().unwrap();
                last_import = Some(serde_json::to_value(&i.manifest).unwrap());
                checked += 1;
            }
            Some("output") => {
                let actual = last_import.as_ref().expect("an output block follows an import block");
                let expected: serde_json::Value =
                    serde_saphyr::from_str(body).unwrap_or_else(|e| panic!("{e}\n{body}"));
                contained(&expected, actual, "").unwrap_or_else(|e| panic!("{e}\n{body}"));
                checked += 1;
            }
            Some("bad-manifest") => {
                let e = manifest::parse("checkout.yaml", body).expect_err("the example must be refused");
                last_error = Some(e.to_string());
                checked += 1;
            }
            Some("message") => {
                let error = last_error.take().expect("a message block follows a bad-manifest block");
                for line in body.lines().filter(|l| !l.trim().is_empty()) {
                    assert!(error.contains(line), "the docs show {line:?}, the error is:\n{error}");
                }
                checked += 1;
            }
            Some("report") => {
                let source: Source = clap::ValueEnum::from_str(words.next().unwrap(), true).unwrap();
                let file = words.next().unwrap();
                let report = super::import_file(source, file).report.render();
                for line in body.lines().filter(|l| !l.trim().is_empty()) {
                    assert!(
                        report.lines().any(|r| r.ends_with(line) || r == line),
                        "the docs show {line:?}, the report is:\n{report}"
                    );
                }
                checked += 1;
            }
            other => panic!("unknown check {other:?}"),
        }
    }
    assert!(checked >= 15, "only {checked} checked blocks in docs/importers.md");
}
