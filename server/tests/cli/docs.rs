//! The examples of docs/cli.md are checked: a block after `<!-- check: manifest -->` must
//! decode and validate as a manifest; in a block after `<!-- check: cli -->` (a shell
//! session or a CI job), every `levee` command must parse with the real command line
//! definition, so a renamed flag or subcommand fails here.

use clap::Parser;
use levee_server::cli::ClientCommand;
use levee_server::manifest;

#[path = "../shared/doc_blocks.rs"]
mod doc_blocks;
use doc_blocks::blocks;

/// The client commands as `levee` parses them.
#[derive(Debug, Parser)]
#[command(name = "levee")]
struct Levee {
    #[command(subcommand)]
    command: ClientCommand,
}

/// Splits a shell line into words: single and double quotes group, a backslash escapes
/// the next character; variables stay as written.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (None, c) => cur.push(c),
        }
    }
    assert!(quote.is_none(), "unbalanced quotes in {line:?}");
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Every `levee <client command> …` of a block, up to the end of its line or a shell
/// operator.
fn commands(body: &str) -> Vec<Vec<String>> {
    let client = ["login", "get", "export", "apply", "flip", "profile", "tokens", "experiment"];
    let mut out = Vec::new();
    for line in body.lines() {
        let w = words(line);
        let mut i = 0;
        while i + 1 < w.len() {
            if w[i] == "levee" && client.contains(&w[i + 1].as_str()) {
                let end = w[i..]
                    .iter()
                    .position(|x| ["&&", "||", ";", "|"].contains(&x.as_str()))
                    .map_or(w.len(), |e| i + e);
                out.push(w[i..end].to_vec());
                i = end;
            } else {
                i += 1;
            }
        }
    }
    out
}

#[test]
fn the_examples_in_docs_cli_md_parse() {
    let md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli.md")).unwrap();
    let mut manifests = 0;
    let mut parsed = Vec::new();
    for (kind, body) in blocks(&md) {
        match kind.as_str() {
            "manifest" => {
                manifest::parse("docs/cli.md", &body).unwrap_or_else(|e| panic!("{e}\n{body}"));
                manifests += 1;
            }
            "cli" => {
                let cmds = commands(&body);
                assert!(!cmds.is_empty(), "a cli block without a levee command:\n{body}");
                for c in cmds {
                    Levee::try_parse_from(&c).unwrap_or_else(|e| panic!("{}\n{e}", c.join(" ")));
                    parsed.push(c[1].clone());
                }
            }
            other => panic!("unknown check {other:?} in docs/cli.md"),
        }
    }
    assert!(manifests >= 1);
    for sub in ["login", "get", "export", "apply", "flip", "profile", "tokens"] {
        assert!(parsed.iter().any(|p| p == sub), "docs/cli.md shows no checked `levee {sub}`: {parsed:?}");
    }
}

#[test]
fn the_shell_splitter_groups_quotes_and_stops_at_operators() {
    assert_eq!(
        commands(
            r#"x=1; levee apply -f a --reason "PR ${{ github.event.number }}" --dry-run && echo 'done'"#
        ),
        vec![vec!["levee", "apply", "-f", "a", "--reason", "PR ${{ github.event.number }}", "--dry-run"]]
    );
    assert!(commands("git commit -m \"Levee policies\"").is_empty());
}
