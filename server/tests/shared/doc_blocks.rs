//! The checked examples of a Markdown document: every fenced block right after a
//! `<!-- check: KIND … -->` line, as `(KIND …, body)`. Shared by the tests of
//! docs/importers.md and docs/cli.md (`#[path]`), each of which decides what a kind means.

/// `(marker, body)` of every fenced block right after a `<!-- check: … -->` line.
pub fn blocks(md: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut pending: Option<String> = None;
    let mut lines = md.lines();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("<!-- check:").and_then(|r| r.strip_suffix("-->")) {
            pending = Some(rest.trim().to_string());
        } else if t.starts_with("```") && pending.is_some() {
            let mut body = String::new();
            for l in lines.by_ref() {
                if l.trim_start().starts_with("```") {
                    break;
                }
                body.push_str(l);
                body.push('\n');
            }
            out.push((pending.take().unwrap_or_default(), body));
        }
    }
    out
}
