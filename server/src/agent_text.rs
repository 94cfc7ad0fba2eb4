//! What agents send is untrusted (SEC-2): every string an agent reports passes through one
//! of these before it is stored, logged or shown.
//!
//! - Identifiers the agent chooses (`instance_id`, `agent_version`) must match a small
//!   character set and length, or the stream is refused ([`check_instance_id`],
//!   [`check_version`]).
//! - Words from a fixed vocabulary (breaker states, feature levels, the config source) are
//!   kept only when they are one of the known words, else replaced by [`UNRECOGNIZED`]
//!   ([`one_of`]): an agent cannot make the server say something it does not know.
//! - Free text (a NACK's reason, a breaker's last transition reason, names) is bounded in
//!   characters and has every control or invisible formatting character escaped
//!   (`\n`, `\u{1b}`, `\u{202e}`), so it can never break a log line or reorder what is
//!   shown around it ([`text`]).
//!
//! Logs carry these strings as structured fields (`detail = ?text`), quoted and escaped by
//! the formatter on top.

use levee_agent::breaker::State;
use levee_agent::policy::FallbackLevel;

/// Longest `instance_id`, in bytes.
pub const MAX_INSTANCE_ID: usize = 128;
/// Longest `agent_version`, in bytes.
pub const MAX_VERSION: usize = 64;
/// Longest NACK reason kept, in characters (the rest is cut, marked with `…`).
pub const MAX_DETAIL_CHARS: usize = 4000;
/// Longest name (dependency, operation, feature, counter) kept, in characters.
pub const MAX_NAME_CHARS: usize = 128;
/// Longest short reason (a breaker's last transition) kept, in characters.
pub const MAX_REASON_CHARS: usize = 256;
/// Most entries of each list of a status report that are kept.
pub const MAX_REPORT_ENTRIES: usize = 256;
/// What replaces a word outside its vocabulary.
pub const UNRECOGNIZED: &str = "UNRECOGNIZED";

/// The words of every value of an agent enum, as its `as_str` spells them: a vocabulary
/// taken from the agent, never copied.
macro_rules! words_of {
    ($all:expr, $word:path) => {{
        let mut words = [""; $all.len()];
        let mut i = 0;
        while i < words.len() {
            words[i] = $word($all[i]);
            i += 1;
        }
        words
    }};
}

/// Breaker states an agent may report: the agent's own words ([`State::as_str`]).
pub const BREAKER_STATES: &[&str] = &words_of!(State::ALL, State::as_str);
/// Feature levels an agent may report.
pub const FEATURE_LEVELS: &[&str] = &words_of!(FallbackLevel::ALL, FallbackLevel::as_str);
/// Where an agent's configuration may come from.
pub const SOURCES: &[&str] = &["live", "cache", "default"];

/// Checks an instance id: 1 to [`MAX_INSTANCE_ID`] bytes of `A-Z a-z 0-9 . _ : @ / -`
/// (a UUID, a pod or host name, `host:pid`).
///
/// # Errors
/// What is allowed, in words.
pub fn check_instance_id(v: &str) -> Result<(), String> {
    check_word(v, MAX_INSTANCE_ID, b"._:@/-", "instance_id")
}

/// Checks an agent version: 1 to [`MAX_VERSION`] bytes of `A-Z a-z 0-9 . _ + -`
/// (SemVer with pre-release and build).
///
/// # Errors
/// What is allowed, in words.
pub fn check_version(v: &str) -> Result<(), String> {
    check_word(v, MAX_VERSION, b"._+-", "agent_version")
}

fn check_word(v: &str, max: usize, extra: &[u8], field: &str) -> Result<(), String> {
    let ok =
        !v.is_empty() && v.len() <= max && v.bytes().all(|b| b.is_ascii_alphanumeric() || extra.contains(&b));
    if ok {
        Ok(())
    } else {
        let allowed: String = extra.iter().map(|&b| format!(" {}", b as char)).collect();
        Err(format!(
            "{field} must be 1 to {max} characters of A-Z, a-z, 0-9 and{allowed} (got {:?})",
            text(v, 64)
        ))
    }
}

/// `v` when it is one of `vocabulary`, else [`UNRECOGNIZED`].
pub fn one_of(v: &str, vocabulary: &[&'static str]) -> &'static str {
    vocabulary.iter().copied().find(|w| *w == v).unwrap_or(UNRECOGNIZED)
}

/// Whether `c` is shown as an escape: control characters (newline, carriage return, tab,
/// escape, C1) and invisible formatting characters that reorder or hide text (zero-width,
/// bidirectional overrides and isolates, the BOM, line and paragraph separators).
fn escaped(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// Free text an agent sent, made safe to store, log and show: at most `max_chars`
/// characters (cut with a trailing `…`), every control or invisible formatting character
/// written as an escape (`\n`, `\r`, `\t`, `\u{…}`) and every backslash doubled, so the
/// result is one line whose escapes cannot be confused with the agent's own text.
pub fn text(v: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(v.len().min(max_chars * 2));
    for (i, c) in v.chars().enumerate() {
        if i == max_chars {
            out.push('…');
            break;
        }
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if escaped(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// A name an agent reports (dependency, operation, feature, counter): [`text`] bounded
/// by [`MAX_NAME_CHARS`].
pub fn name(v: &str) -> String {
    text(v, MAX_NAME_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_one_line_bounded_and_unambiguous() {
        let forged = "bad policy\n2026-12-01T08:00:00Z  INFO flag changed from the UI actor=admin";
        let t = text(forged, MAX_DETAIL_CHARS);
        assert!(!t.contains('\n'));
        assert_eq!(t, "bad policy\\n2026-12-01T08:00:00Z  INFO flag changed from the UI actor=admin");
        assert_eq!(text("a\r\tb\u{1b}[31m", 100), "a\\r\\tb\\u{1b}[31m");
        assert_eq!(text("evil\u{202e}gnp.exe", 100), "evil\\u{202e}gnp.exe");
        assert_eq!(text("a\u{2028}b\u{85}c", 100), "a\\u{2028}b\\u{85}c");
        // A literal backslash-n from the agent stays distinguishable from an escaped newline.
        assert_eq!(text("a\\nb", 100), "a\\\\nb");
        assert_eq!(text(&"x".repeat(10), 4), "xxxx…");
        assert_eq!(text("é日本", 100), "é日本");
    }

    #[test]
    fn words_outside_their_vocabulary_are_not_repeated() {
        assert_eq!(one_of("OPEN", BREAKER_STATES), "OPEN");
        assert_eq!(one_of("OPEN\nINFO forged", BREAKER_STATES), UNRECOGNIZED);
        assert_eq!(one_of("open", BREAKER_STATES), UNRECOGNIZED);
        assert_eq!(one_of("live", SOURCES), "live");
        assert_eq!(one_of("verified by server", SOURCES), UNRECOGNIZED);
    }

    /// The breaker states and feature levels kept are the agent's own words.
    #[test]
    fn breaker_states_are_the_agents_words() {
        assert_eq!(
            BREAKER_STATES,
            ["CLOSED", "OPEN", "HALF_OPEN", "FORCED_OPEN", "FORCED_CLOSED", "DISABLED"]
        );
        for w in BREAKER_STATES {
            assert_eq!(State::parse(w).map(State::as_str), Some(*w));
        }
        assert_eq!(State::parse(UNRECOGNIZED), None);
        assert_eq!(FEATURE_LEVELS, ["FRESH", "STALE", "GENERIC", "EMPTY_MARKED", "FEATURE_ERROR"]);
    }

    #[test]
    fn identifiers_have_a_small_alphabet() {
        assert!(check_instance_id("6f1c0c9e-8d8a-4c4e-9f57-3f0d2b7a1c11").is_ok());
        assert!(check_instance_id("checkout-7d9f:1234").is_ok());
        assert!(check_instance_id("").is_err());
        assert!(check_instance_id(&"a".repeat(MAX_INSTANCE_ID + 1)).is_err());
        let e = check_instance_id("pod-1\nINFO forged").unwrap_err();
        assert!(e.contains("instance_id") && e.contains("\\n") && !e.contains('\n'), "{e}");
        assert!(check_version("0.1.0-rc.1+build.5").is_ok());
        assert!(check_version("0.1.0 (trusted)").is_err());
    }
}
