//! Wall-clock instants used for expiries (`expires_at`) and audit times.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// A point in wall-clock time with millisecond precision.
///
/// Serialized as an RFC 3339 string with milliseconds (`"2026-11-30T15:00:00.000Z"`); any
/// offset and any number of fraction digits are accepted on input, normalized to UTC and
/// milliseconds on output. Wall-clock time is used only for expiries that a
/// person sets (they are absolute by nature); every duration the agent measures uses the
/// monotonic clock instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime, example = "2026-12-01T12:00:00Z"))]
pub struct Timestamp(i64);

impl Timestamp {
    /// Builds a timestamp from milliseconds since the Unix epoch.
    pub const fn from_unix_ms(ms: i64) -> Self {
        Self(ms)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn unix_ms(self) -> i64 {
        self.0
    }

    /// The current wall-clock time.
    pub fn now() -> Self {
        let ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
        Self(ms)
    }

    /// Parses an RFC 3339 string. Returns `None` when it is not one.
    pub fn parse(s: &str) -> Option<Self> {
        let t = OffsetDateTime::parse(s, &Rfc3339).ok()?;
        let ms = t.unix_timestamp_nanos() / 1_000_000;
        i64::try_from(ms).ok().map(Self)
    }

    /// Formats as RFC 3339 in UTC with exactly three fraction digits
    /// (`2026-12-01T12:00:00.000Z`): every time has the same length, so times written by
    /// the server sort as strings the way they sort as instants. A time outside the years
    /// 0000–9999, which RFC 3339 cannot spell, is written as its milliseconds.
    pub fn to_rfc3339(self) -> String {
        let nanos = i128::from(self.0) * 1_000_000;
        match OffsetDateTime::from_unix_timestamp_nanos(nanos) {
            Ok(t) if (0..=9999).contains(&t.year()) => format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
                t.year(),
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second(),
                t.millisecond()
            ),
            _ => self.0.to_string(),
        }
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Timestamp::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "invalid timestamp {s:?}: expected RFC 3339, e.g. \"2026-12-01T12:00:00Z\""
            ))
        })
    }
}

/// Serde `with` module for an `i64` of milliseconds since the Unix epoch, written and read
/// as an RFC 3339 string, as [`Timestamp`] is: `#[serde(with = "levee_agent::policy::rfc3339")]`.
///
/// This is how every time in the server's API is spelled, whatever its storage keeps
/// (`"2026-12-01T12:00:00.000Z"`, UTC, always three fraction digits; any offset accepted on
/// input).
/// With the `openapi` feature, pair it with `#[schema(value_type = String, format = DateTime)]`.
pub mod rfc3339 {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Timestamp;

    /// Writes `ms` as RFC 3339.
    pub fn serialize<S: Serializer>(ms: &i64, s: S) -> Result<S::Ok, S::Error> {
        Timestamp::from_unix_ms(*ms).serialize(s)
    }

    /// Reads RFC 3339 into milliseconds; the error echoes the value and shows the format.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        Timestamp::deserialize(d).map(Timestamp::unix_ms)
    }

    /// The same for `Option<i64>` (`null` when absent).
    pub mod option {
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        use super::Timestamp;

        /// Writes `Some(ms)` as RFC 3339, `None` as `null`.
        pub fn serialize<S: Serializer>(ms: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
            ms.map(Timestamp::from_unix_ms).serialize(s)
        }

        /// Reads RFC 3339 or `null`.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
            Ok(Option::<Timestamp>::deserialize(d)?.map(Timestamp::unix_ms))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_rfc3339_and_normalizes_offsets() {
        let t = Timestamp::parse("2026-12-01T13:00:00+01:00").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-12-01T12:00:00.000Z");
        assert_eq!(Timestamp::parse(&t.to_rfc3339()), Some(t));
        assert_eq!(Timestamp::parse("tomorrow"), None);
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Row {
        #[serde(with = "rfc3339")]
        at: i64,
        #[serde(with = "rfc3339::option")]
        until: Option<i64>,
    }

    /// The API's times sort as strings: a whole second and a later instant within it
    /// compare as instants do, which they would not if `.000` were left out
    /// (`"…:00Z"` > `"…:00.5Z"`).
    #[test]
    fn every_time_has_three_fraction_digits_so_strings_sort_as_instants() {
        let times: Vec<i64> =
            vec![1_764_590_400_000, 1_764_590_400_100, 1_764_590_400_120, 1_764_590_401_000];
        let written: Vec<String> = times.iter().map(|&ms| Timestamp::from_unix_ms(ms).to_rfc3339()).collect();
        assert_eq!(
            written,
            [
                "2025-12-01T12:00:00.000Z",
                "2025-12-01T12:00:00.100Z",
                "2025-12-01T12:00:00.120Z",
                "2025-12-01T12:00:01.000Z"
            ]
        );
        let mut sorted = written.clone();
        sorted.sort();
        assert_eq!(sorted, written);
        assert_eq!(
            Timestamp::parse("2025-12-01T12:00:00.1234567Z"),
            Some(Timestamp::from_unix_ms(1_764_590_400_123))
        );
    }

    #[test]
    fn milliseconds_are_written_and_read_as_rfc3339() {
        let row = Row { at: 1_764_590_400_123, until: None };
        let json = serde_json::to_string(&row).unwrap();
        assert_eq!(json, r#"{"at":"2025-12-01T12:00:00.123Z","until":null}"#);
        assert_eq!(serde_json::from_str::<Row>(&json).unwrap(), row);
        let e = serde_json::from_str::<Row>(r#"{"at":"yesterday","until":null}"#).unwrap_err();
        assert!(e.to_string().contains(r#"invalid timestamp "yesterday": expected RFC 3339"#), "{e}");
    }
}
