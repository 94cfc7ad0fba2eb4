//! Durations as people write them: a string of numbers with units (`"250ms"`, `"1.5s"`,
//! `"2m 30s"`), the one spelling of every duration in the policy and the API.
//!
//! Serde `with` module: `#[serde(with = "levee_agent::policy::duration")]` on a
//! `Duration`, `duration::option` on an `Option<Duration>`. Output is humantime's
//! (`"1s 500ms"`); input is anything `humantime::parse_duration` reads. A value that is not
//! one gets an error that echoes it and lists what is accepted, so a person can fix it
//! without reading the docs.

use std::fmt;
use std::time::Duration;

use serde::Serializer;
use serde::de::{self, Deserializer, Visitor};

/// What a duration looks like, as said in every error about one.
pub const ACCEPTED: &str =
    r#"a number with a unit, e.g. "250ms", "1.5s", "2m" or "1h 30m" (units: ns, us, ms, s, m, h, d)"#;

/// Parses a duration written as [`ACCEPTED`] says.
///
/// # Errors
/// A sentence that echoes `s`, says what is wrong with it and what is accepted.
pub fn parse(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("invalid duration {s:?} ({e}): expected {ACCEPTED}"))
}

/// Writes a duration as humantime does (`"1s 500ms"`).
pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    humantime_serde::serialize(d, s)
}

/// Reads a duration string; see [`parse`].
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_str(DurationVisitor)
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a duration string: {ACCEPTED}")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
        parse(v).map_err(E::custom)
    }
}

/// The same for `Option<Duration>` (`null` or absent = `None`).
pub mod option {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes `Some(d)` as a duration string, `None` as `null`.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        d.map(humantime_serde::Serde::from).serialize(s)
    }

    /// Reads a duration string or `null`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<Wrapped>::deserialize(d)?.map(|w| w.0))
    }

    struct Wrapped(Duration);

    impl<'de> Deserialize<'de> for Wrapped {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            super::deserialize(d).map(Wrapped)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Doc {
        #[serde(with = "super")]
        timeout: Duration,
        #[serde(with = "super::option", default)]
        slow: Option<Duration>,
    }

    #[test]
    fn reads_units_and_fractions_and_writes_humantime() {
        let d: Doc = serde_json::from_str(r#"{"timeout": "1.5s", "slow": "250ms"}"#).unwrap();
        assert_eq!(d, Doc { timeout: Duration::from_millis(1500), slow: Some(Duration::from_millis(250)) });
        assert_eq!(serde_json::to_string(&d).unwrap(), r#"{"timeout":"1s 500ms","slow":"250ms"}"#);
        let d: Doc = serde_json::from_str(r#"{"timeout": "2m 30s", "slow": null}"#).unwrap();
        assert_eq!((d.timeout, d.slow), (Duration::from_secs(150), None));
    }

    #[test]
    fn a_bad_duration_is_echoed_with_the_accepted_formats() {
        for (input, echoed) in [
            (r#"{"timeout": "250"}"#, r#"invalid duration "250""#),
            (r#"{"timeout": "fast"}"#, r#"invalid duration "fast""#),
            (r#"{"timeout": "1.5 sec"}"#, ""),
            (r#"{"timeout": "3 parsecs"}"#, r#"invalid duration "3 parsecs""#),
            (r#"{"timeout": "1s", "slow": "-1s"}"#, r#"invalid duration "-1s""#),
        ] {
            match serde_json::from_str::<Doc>(input) {
                Ok(d) => assert!(echoed.is_empty(), "{input} parsed as {d:?}"),
                Err(e) => {
                    let e = e.to_string();
                    assert!(e.contains(echoed), "{input}: {e}");
                    assert!(e.contains(r#""250ms", "1.5s""#), "{input}: {e}");
                }
            }
        }
        let e = serde_json::from_str::<Doc>(r#"{"timeout": 250}"#).unwrap_err().to_string();
        assert!(e.contains("integer `250`") && e.contains(r#""250ms", "1.5s""#), "{e}");
    }
}
