//! Wall-clock instants used for expiries (`expires_at`) and audit times.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// A point in wall-clock time with millisecond precision.
///
/// Serialized as an RFC 3339 string (`"2026-11-30T15:00:00Z"`); any offset is accepted on
/// input and normalized to UTC on output. Wall-clock time is used only for expiries that a
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

    /// Formats as RFC 3339 in UTC.
    pub fn to_rfc3339(self) -> String {
        let nanos = i128::from(self.0) * 1_000_000;
        match OffsetDateTime::from_unix_timestamp_nanos(nanos) {
            Ok(t) => t.format(&Rfc3339).unwrap_or_else(|_| self.0.to_string()),
            Err(_) => self.0.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_rfc3339_and_normalizes_offsets() {
        let t = Timestamp::parse("2026-12-01T13:00:00+01:00").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-12-01T12:00:00Z");
        assert_eq!(Timestamp::parse(&t.to_rfc3339()), Some(t));
        assert_eq!(Timestamp::parse("tomorrow"), None);
    }
}
