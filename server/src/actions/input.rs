//! Input checked for its form before an action runs (parse, don't validate): a value of
//! one of these types is known to be well-formed.

use levee_agent::policy::{FieldError, check_name};

/// Most bytes of a free text: a reason, an environment's description.
pub const MAX_TEXT_BYTES: usize = 1000;

/// An input value without the accepted form: names the field, the value and what is allowed.
/// The API answers it with 400.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid request: {0}")]
pub struct BadInput(pub FieldError);

impl BadInput {
    /// The field at `path` with `value` (as written; empty when missing) and what is allowed.
    pub fn new(path: &str, value: impl Into<String>, message: impl Into<String>) -> BadInput {
        BadInput(FieldError { path: path.into(), value: value.into(), message: message.into() })
    }
}

/// Checks that the free text in field `path` is at most [`MAX_TEXT_BYTES`] long.
///
/// # Errors
/// [`BadInput`] with the length in bytes.
pub fn check_text(path: &str, text: &str) -> Result<(), BadInput> {
    if text.len() > MAX_TEXT_BYTES {
        return Err(BadInput::new(
            path,
            format!("{} bytes", text.len()),
            format!("must be at most {MAX_TEXT_BYTES} bytes"),
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

/// Why a change is made, recorded in the audit log: required for every change, trimmed, at
/// most [`MAX_TEXT_BYTES`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reason(String);

/// Why a reason was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReasonError {
    /// Empty or only whitespace.
    #[error("a reason is required for every change")]
    Missing,
    /// Longer than [`MAX_TEXT_BYTES`] after trimming.
    #[error("must be at most {MAX_TEXT_BYTES} bytes")]
    TooLong {
        /// Its length in bytes.
        bytes: usize,
    },
}

impl Reason {
    /// Trims `text` and checks it.
    ///
    /// # Errors
    /// [`ReasonError`]; it converts into a [`BadInput`] on the field `reason`.
    pub fn parse(text: &str) -> Result<Reason, ReasonError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(ReasonError::Missing);
        }
        if check_text("reason", text).is_err() {
            return Err(ReasonError::TooLong { bytes: text.len() });
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
            ReasonError::TooLong { bytes } => {
                BadInput::new("reason", format!("{bytes} bytes"), e.to_string())
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
        let long = "x".repeat(MAX_TEXT_BYTES + 1);
        assert_eq!(Reason::parse(&long), Err(ReasonError::TooLong { bytes: MAX_TEXT_BYTES + 1 }));
        assert!(Reason::parse(&"x".repeat(MAX_TEXT_BYTES)).is_ok());
        let bad = BadInput::from(ReasonError::TooLong { bytes: 1001 });
        assert_eq!(bad.0.path, "reason");
        assert_eq!(bad.to_string(), "invalid request: reason: must be at most 1000 bytes (got 1001 bytes)");
    }

    #[test]
    fn names_follow_the_agents_rule_and_name_the_field() {
        assert_eq!(Name::parse("key", "checkout.enabled").unwrap().as_str(), "checkout.enabled");
        let e = Name::parse("services[1]", "Bad Name").unwrap_err();
        assert_eq!(e.0.path, "services[1]");
        assert_eq!(e.0.value, "\"Bad Name\"");
    }
}
