//! Input checked for its form before an action runs (parse, don't validate): a value of
//! one of these types is known to be well-formed.

use levee_agent::policy::{FieldError, check_name};

/// Most characters (Unicode scalar values, as JSON Schema's `maxLength` counts them) of a
/// free text: a reason, an environment's description.
pub const MAX_TEXT_CHARS: usize = 1000;

/// The characters trimmed from both ends of a reason. Only these four, so that the OpenAPI
/// document can state the rule exactly ([`REASON_PATTERN`]): a reason must hold a character
/// other than these.
pub const REASON_BLANKS: [char; 4] = [' ', '\t', '\n', '\r'];

/// A regular expression (ECMA-262, unanchored as JSON Schema's `pattern` is) that a reason
/// the server accepts matches: one character that is not in [`REASON_BLANKS`].
pub const REASON_PATTERN: &str = "[^ \\t\\n\\r]";

/// A regular expression stating `levee_agent::policy::check_name` for JSON Schema: a
/// lowercase letter or digit, then up to 63 of lowercase letters, digits, `.`, `_`, `-`.
/// A test checks it against the rule.
pub const NAME_PATTERN: &str = "^[a-z0-9][a-z0-9._-]{0,63}$";

/// An input value refused before an action runs: names the field, the value and what is
/// allowed, and whether the value is outside the accepted form or breaks a rule between
/// fields each in that form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid request: {0}")]
pub struct BadInput(pub FieldError, pub Broken);

/// What a [`BadInput`] breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broken {
    /// The value's own form: a type, pattern, length or range the OpenAPI document states
    /// (the API answers 400).
    Form,
    /// A rule the document states in words only: over several fields (exactly one of two,
    /// at least one of three) or a range of a duration (the API answers 422).
    Rule,
}

impl BadInput {
    /// The field at `path` with `value` (as written; empty when missing) and what is allowed.
    pub fn new(path: &str, value: impl Into<String>, message: impl Into<String>) -> BadInput {
        BadInput(FieldError { path: path.into(), value: value.into(), message: message.into() }, Broken::Form)
    }

    /// A value in form that breaks a rule the document states in words only.
    pub fn rule(path: &str, value: impl Into<String>, message: impl Into<String>) -> BadInput {
        BadInput(FieldError { path: path.into(), value: value.into(), message: message.into() }, Broken::Rule)
    }
}

/// Checks that the free text in field `path` is at most [`MAX_TEXT_CHARS`] characters long.
///
/// # Errors
/// [`BadInput`] with the length in characters.
pub fn check_text(path: &str, text: &str) -> Result<(), BadInput> {
    let chars = text.chars().count();
    if chars > MAX_TEXT_CHARS {
        return Err(BadInput::new(
            path,
            format!("{chars} characters"),
            format!("must be at most {MAX_TEXT_CHARS} characters"),
        ));
    }
    Ok(())
}

/// The name of an environment, service, flag, fault rule, token or user, accepted by the
/// agent's `levee_agent::policy::check_name` (the one rule for names).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Name(String);

impl Name {
    /// Checks `value`, the content of field `field`.
    ///
    /// # Errors
    /// [`BadInput`] naming `field` and quoting `value`.
    pub fn parse(field: &str, value: &str) -> Result<Name, BadInput> {
        check_name(value).map_err(|m| BadInput::new(field, format!("{value:?}"), m))?;
        Ok(Name(value.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a change is made, recorded in the audit log: required for every change, at most
/// [`MAX_TEXT_CHARS`] characters as sent, recorded without the [`REASON_BLANKS`] at its ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reason(String);

/// Why a reason was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReasonError {
    /// Empty or only [`REASON_BLANKS`].
    #[error("a reason is required for every change")]
    Missing,
    /// Longer than [`MAX_TEXT_CHARS`].
    #[error("must be at most {MAX_TEXT_CHARS} characters")]
    TooLong {
        /// Its length in characters, as sent.
        chars: usize,
    },
}

impl Reason {
    /// Checks `text` as sent (its length), then trims [`REASON_BLANKS`] and checks that
    /// something is left.
    ///
    /// # Errors
    /// [`ReasonError`]; it converts into a [`BadInput`] on the field `reason`.
    pub fn parse(text: &str) -> Result<Reason, ReasonError> {
        let chars = text.chars().count();
        if chars > MAX_TEXT_CHARS {
            return Err(ReasonError::TooLong { chars });
        }
        let text = text.trim_matches(REASON_BLANKS);
        if text.is_empty() {
            return Err(ReasonError::Missing);
        }
        Ok(Reason(text.to_string()))
    }

    /// A reason the server gives for its own change.
    pub(super) fn by_server(text: String) -> Reason {
        Reason(text)
    }

    /// The reason as recorded.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<ReasonError> for BadInput {
    fn from(e: ReasonError) -> BadInput {
        match e {
            ReasonError::Missing => BadInput::new("reason", "\"\"", e.to_string()),
            ReasonError::TooLong { chars } => {
                BadInput::new("reason", format!("{chars} characters"), e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_trimmed_required_and_bounded() {
        assert_eq!(Reason::parse("  outage  ").unwrap().as_str(), "outage");
        assert_eq!(Reason::parse(" \n "), Err(ReasonError::Missing));
        let long = "x".repeat(MAX_TEXT_CHARS + 1);
        assert_eq!(Reason::parse(&long), Err(ReasonError::TooLong { chars: MAX_TEXT_CHARS + 1 }));
        assert!(Reason::parse(&"x".repeat(MAX_TEXT_CHARS)).is_ok());
        // Characters, not bytes: JSON Schema's maxLength counts them so.
        assert!(Reason::parse(&"é".repeat(MAX_TEXT_CHARS)).is_ok());
        // The length is the one sent: blanks count, as the schema's maxLength counts them.
        let padded = format!(" {} ", "x".repeat(MAX_TEXT_CHARS - 1));
        assert_eq!(Reason::parse(&padded), Err(ReasonError::TooLong { chars: MAX_TEXT_CHARS + 1 }));
        let bad = BadInput::from(ReasonError::TooLong { chars: 1001 });
        assert_eq!(bad.0.path, "reason");
        assert_eq!(
            bad.to_string(),
            "invalid request: reason: must be at most 1000 characters (got 1001 characters)"
        );
    }

    /// A reason is accepted exactly when it matches the documented pattern and length.
    #[test]
    fn the_documented_reason_form_agrees_with_parse() {
        let pattern = regex::Regex::new(REASON_PATTERN).unwrap();
        for text in ["", " ", "\t\n\r ", "x", " x ", "\u{a0}", "\u{2003}", "\u{85}", "\u{b}", "a b"] {
            assert_eq!(Reason::parse(text).is_ok(), pattern.is_match(text), "{text:?}");
        }
    }

    /// The pattern the OpenAPI document gives for names states the agent's name rule.
    #[test]
    fn the_documented_name_pattern_agrees_with_check_name() {
        let pattern = regex::Regex::new(NAME_PATTERN).unwrap();
        let long = "a".repeat(64);
        let too_long = "a".repeat(65);
        for text in [
            "",
            "a",
            "0",
            "a.b_c-d",
            "-a",
            ".a",
            "_a",
            "A",
            "aB",
            "a b",
            "é",
            "a/b",
            "a\n",
            long.as_str(),
            too_long.as_str(),
        ] {
            assert_eq!(check_name(text).is_ok(), pattern.is_match(text), "{text:?}");
        }
    }

    #[test]
    fn names_follow_the_agents_rule_and_name_the_field() {
        assert_eq!(Name::parse("key", "checkout.enabled").unwrap().as_str(), "checkout.enabled");
        let e = Name::parse("services[1]", "Bad Name").unwrap_err();
        assert_eq!(e.0.path, "services[1]");
        assert_eq!(e.0.value, "\"Bad Name\"");
    }
}
