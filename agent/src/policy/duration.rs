//! Durations as people write them: numbers with units (`"250ms"`, `"1.5s"`, `"2m 30s"`),
//! the one spelling of every duration in the policy, the API, the CLI and the UI.
//!
//! Serde `with` module: `#[serde(with = "levee_agent::policy::duration")]` on a
//! `Duration`, `duration::option` on an `Option<Duration>`. Input: one or more
//! `<number><unit>` parts, largest unit first, each unit at most once, spaces (U+0020, no
//! other blank) allowed around and between parts and between a number and its unit; the
//! number has at most [`MAX_WHOLE_DIGITS`] digits before its point and at most 9 after it
//! (`"1.5h"`, `".5s"`); units `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`, `d`, lower case only
//! (so `"1M"` is an error, not a month). [`PATTERN`] states the same as a regular expression
//! for the OpenAPI document. Output
//! ([`format()`]) uses the same units (`"1s 500ms"`, `"7d"`), so whatever is written back —
//! an export, an error, a page — reads in again unchanged. A value that is not one gets an
//! error that echoes it, says what is wrong and lists what is accepted.

use std::fmt;
use std::time::Duration;

use serde::Serializer;
use serde::de::{self, Deserializer, Visitor};

/// What a duration looks like, as said in every error about one.
pub const ACCEPTED: &str =
    r#"a number with a unit, e.g. "250ms", "1.5s", "2m" or "1h 30m" (units: ns, us, ms, s, m, h, d)"#;

/// Most digits before a number's decimal point: enough for any duration a policy holds,
/// few enough that no sum of parts overflows.
pub const MAX_WHOLE_DIGITS: usize = 14;

/// Most digits after a number's decimal point: nanoseconds of a second.
const MAX_FRACTION_DIGITS: usize = 9;

/// A number of a part: digits, a fraction, or both (the digit counts are the constants above).
macro_rules! num {
    () => {
        r"(?:[0-9]{1,14}(?:\.[0-9]{0,9})?|\.[0-9]{1,9})"
    };
}

/// One part `<number><unit>` of a duration, spaces allowed between them.
macro_rules! part {
    ($unit:literal) => {
        concat!("(?:", num!(), " *", $unit, ")")
    };
}

/// The parts after a first one, each optional, in the order given.
macro_rules! then_parts {
    () => {
        ""
    };
    ($unit:literal $($rest:literal)*) => {
        concat!("(?: *", part!($unit), ")?", then_parts!($($rest)*))
    };
}

/// Every way to write a duration whose largest unit is one of those given (largest first):
/// one alternative per first unit, followed by any of the smaller ones.
macro_rules! alternatives {
    ($unit:literal) => {
        part!($unit)
    };
    ($unit:literal $($rest:literal)+) => {
        concat!(part!($unit), then_parts!($($rest)+), "|", alternatives!($($rest)+))
    };
}

/// The form [`parse`] accepts, as an ECMA-262 regular expression (the dialect of JSON
/// Schema's `pattern`): parts largest unit first, each at most once. A test checks that a
/// string matches it exactly when `parse` accepts it.
pub const PATTERN: &str = concat!("^ *(?:", alternatives!("d" "h" "m" "s" "ms" "(?:us|µs)" "ns"), ") *$");

/// Units largest first, with their length in nanoseconds; `format` writes these names.
const UNITS: [(&str, u128); 7] = [
    ("d", 86_400_000_000_000),
    ("h", 3_600_000_000_000),
    ("m", 60_000_000_000),
    ("s", 1_000_000_000),
    ("ms", 1_000_000),
    ("us", 1_000),
    ("ns", 1),
];

/// Parses a duration written as [`ACCEPTED`] says.
///
/// # Errors
/// A sentence that echoes `s`, says what is wrong with it and what is accepted.
pub fn parse(s: &str) -> Result<Duration, String> {
    parse_parts(s.trim_matches(' '))
        .map_err(|why| format!("invalid duration {s:?} ({why}): expected {ACCEPTED}"))
}

fn parse_parts(s: &str) -> Result<Duration, String> {
    if s.is_empty() {
        return Err("empty".into());
    }
    if s.starts_with('-') {
        return Err("a duration cannot be negative".into());
    }
    let mut rest = s;
    let mut total: u128 = 0;
    let mut last_unit = usize::MAX;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let number = &rest[..digits];
        rest = rest[digits..].trim_start_matches(' ');
        let letters = rest.find(|c: char| !(c.is_alphabetic())).unwrap_or(rest.len());
        let unit = &rest[..letters];
        rest = rest[letters..].trim_start_matches(' ');
        if number.is_empty() {
            return Err(format!("expected a number before {:?}", if unit.is_empty() { rest } else { unit }));
        }
        let unit = if unit == "µs" { "us" } else { unit };
        let Some(index) = UNITS.iter().position(|(name, _)| *name == unit) else {
            return Err(if unit.is_empty() {
                format!("no unit after {number}")
            } else {
                format!("unknown unit {unit:?}")
            });
        };
        if last_unit != usize::MAX && index <= last_unit {
            return Err(format!("unit {unit:?} repeated or after a smaller one"));
        }
        last_unit = index;
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return Err(format!("{number:?} is not a number"));
        }
        if whole.len() > MAX_WHOLE_DIGITS {
            return Err(format!("too large: at most {MAX_WHOLE_DIGITS} digits before the point"));
        }
        if fraction.len() > MAX_FRACTION_DIGITS {
            return Err(format!("at most {MAX_FRACTION_DIGITS} digits after the point"));
        }
        let scale = UNITS[index].1;
        let too_large = || "too large".to_string();
        let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| too_large())? };
        let mut part = whole.checked_mul(scale).ok_or_else(too_large)?;
        // The fraction, digit by digit, to the nanosecond (further digits are dropped).
        let mut unit_len = scale;
        for digit in fraction.bytes() {
            unit_len /= 10;
            part += u128::from(digit - b'0') * unit_len;
        }
        total = total.checked_add(part).ok_or_else(too_large)?;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| "too large".to_string())?;
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// Writes a duration in the units [`parse`] reads, largest first, zero parts left out:
/// `"1s 500ms"`, `"7d"`, `"1h 30m"`; zero is `"0s"`.
pub fn format(d: Duration) -> String {
    let mut left = d.as_nanos();
    if left == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (name, len) in UNITS {
        let n = left / len;
        if n > 0 {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&n.to_string());
            out.push_str(name);
            left -= n * len;
        }
    }
    out
}

/// Writes a duration as [`format()`] does (`"1s 500ms"`).
pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format(*d))
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

/// The OpenAPI schema of a duration string (component `Duration`): a string matching
/// [`PATTERN`]. Name it as the `value_type` of a `Duration` field.
#[cfg(feature = "openapi")]
#[derive(Debug)]
pub struct Text;

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Text {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(ACCEPTED))
            .pattern(Some(PATTERN))
            .min_length(Some(1))
            .examples(["250ms", "1.5s", "1h 30m"])
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Text {
    fn name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
}

/// The same for `Option<Duration>` (`null` or absent = `None`).
pub mod option {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes `Some(d)` as a duration string, `None` as `null`.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        d.map(super::format).serialize(s)
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
    fn reads_units_and_fractions_and_writes_them_back() {
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
            (r#"{"timeout": "1.5 sec"}"#, "unknown unit \"sec\""),
            (r#"{"timeout": "3 parsecs"}"#, r#"invalid duration "3 parsecs""#),
            (r#"{"timeout": "1s", "slow": "-1s"}"#, "cannot be negative"),
            (r#"{"timeout": "5 minutes"}"#, "unknown unit \"minutes\""),
            (r#"{"timeout": "1M"}"#, "unknown unit \"M\""),
            (r#"{"timeout": "1m1m"}"#, "repeated"),
            (r#"{"timeout": "30s 1h"}"#, "after a smaller one"),
            (r#"{"timeout": "1..5s"}"#, "is not a number"),
            (r#"{"timeout": "99999999999999999999999d"}"#, "too large"),
            (r#"{"timeout": ""}"#, "empty"),
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

    #[test]
    fn what_is_written_reads_back_the_same() {
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_micros(1500), "1ms 500us"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_secs(90), "1m 30s"),
            (Duration::from_secs(7 * 86_400), "7d"),
            (Duration::from_secs(86_400 + 7_200), "1d 2h"),
        ] {
            assert_eq!(format(d), text);
            assert_eq!(parse(text), Ok(d), "{text}");
        }
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2µs"), Ok(Duration::from_micros(2)));
        assert_eq!(parse(" 1h30m "), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("2 m 30 s"), Ok(Duration::from_secs(150)));
        assert_eq!(parse("99999999999999d").map(|d| d.as_secs()), Ok(99_999_999_999_999 * 86_400));
        assert!(parse("999999999999999s").unwrap_err().contains("at most 14 digits"));
        assert!(parse("1.0000000001s").unwrap_err().contains("at most 9 digits"));
        // Only spaces separate: a tab or another blank is not part of the form.
        assert!(parse("1s\t").is_err());
        assert!(parse("1s\n").is_err());
        assert!(parse("\u{a0}1s").is_err());
    }

    /// Strings close to the form: digits, points, units, spaces and a few other characters.
    fn near_durations() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let piece = prop_oneof![
            "[0-9]{1,3}",
            Just("123456789012345".to_string()),
            Just(".".to_string()),
            Just("5.25".to_string()),
            Just(".5".to_string()),
            Just("0.1234567891".to_string()),
            prop_oneof![
                Just("d"),
                Just("h"),
                Just("m"),
                Just("s"),
                Just("ms"),
                Just("us"),
                Just("µs"),
                Just("ns"),
                Just("M"),
                Just("x"),
                Just(" "),
                Just("  "),
                Just("\t"),
                Just("\n"),
                Just("-"),
                Just("\u{a0}")
            ]
            .prop_map(str::to_string),
        ];
        proptest::collection::vec(piece, 0..8).prop_map(|v| v.concat())
    }

    /// Well-formed durations: parts in order, random numbers and spacing.
    fn durations() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let units = ["d", "h", "m", "s", "ms", "us", "µs", "ns"];
        (
            proptest::collection::vec(
                (any::<bool>(), "[0-9]{1,14}", "(\\.[0-9]{0,9})?", " {0,2}", " {0,2}"),
                8,
            ),
            " {0,2}",
            " {0,2}",
            0usize..8,
        )
            .prop_map(move |(parts, lead, trail, must)| {
                let mut out = lead;
                for (i, (keep, whole, frac, gap, between)) in parts.into_iter().enumerate() {
                    // "us" and "µs" are one unit: never both.
                    if (keep || i == must) && !(i == 6 && out.contains("us")) {
                        out.push_str(&whole);
                        out.push_str(&frac);
                        out.push_str(&gap);
                        out.push_str(units[i]);
                        out.push_str(&between);
                    }
                }
                out.push_str(&trail);
                out
            })
    }

    proptest::proptest! {
        // A fixed seed: the same cases every run (the suite is deterministic); a failure found
        // once is kept in proptest-regressions/ and replayed first.
        #![proptest_config(proptest::test_runner::Config {
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x006c_6576_6565),
            ..proptest::test_runner::Config::default()
        })]
        #[test]
        fn every_duration_round_trips(nanos in 0u64..u64::MAX) {
            let d = Duration::from_nanos(nanos);
            proptest::prop_assert_eq!(parse(&format(d)), Ok(d));
        }

        #[test]
        fn no_input_panics(s in "\\PC{0,24}") {
            let _ = parse(&s);
        }

        /// The documented pattern states the parser: near misses are refused by both,
        /// well-formed durations accepted by both.
        #[test]
        fn the_pattern_states_the_parser(near in near_durations(), good in durations()) {
            let pattern = regex::Regex::new(PATTERN).unwrap();
            proptest::prop_assert_eq!(pattern.is_match(&near), parse(&near).is_ok(), "{:?}", near);
            proptest::prop_assert!(pattern.is_match(&good), "{:?}", good);
            proptest::prop_assert!(parse(&good).is_ok(), "{:?}", good);
        }
    }
}
