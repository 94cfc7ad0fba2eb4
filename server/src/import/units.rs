//! Units and names of the sources: their duration spellings, and the conversion of their
//! names into Levee names.

use std::time::Duration;

use levee_agent::policy::check_name;

/// A Spring Boot `Duration` property (resilience4j, Spring Cloud): `500ms`, `5s`, `1m`,
/// a bare integer in **milliseconds** (`waitDuration: 100`), or ISO-8601 (`PT90S`,
/// `PT0.5S`, `P1DT2H`). Units: `ns us ms s m h d`, case-insensitive, integers only (as
/// Spring's `DurationStyle.SIMPLE`).
pub fn spring_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.starts_with(['P', 'p']) || t.starts_with("-P") || t.starts_with("+P") {
        return iso8601_duration(t);
    }
    let digits = t.trim_start_matches('+');
    let split = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
    let (num, unit) = digits.split_at(split);
    if num.is_empty() || t.starts_with('-') {
        return Err(format!(
            "{text:?} is not a duration: expected a whole number with a unit (500ms, 5s, 1m) \
             or ISO-8601 (PT5S); a bare number is milliseconds"
        ));
    }
    let n: u64 = num.parse().map_err(|_| format!("{text:?} is too large"))?;
    let d = match unit.to_ascii_lowercase().as_str() {
        "" | "ms" => Duration::from_millis(n),
        "ns" => Duration::from_nanos(n),
        "us" => Duration::from_micros(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        "d" => Duration::from_secs(n.saturating_mul(86400)),
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?}; Spring reads a whole number with ns, us, ms, s, m, h or d \
                 (500ms, 5s, 1m), ISO-8601 (PT5S), or a bare number in milliseconds"
            ));
        }
    };
    Ok(d)
}

/// ISO-8601 as Java's `Duration.parse` reads it: `PnDTnHnMn.nS` (non-negative here).
fn iso8601_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not an ISO-8601 duration such as PT90S, PT0.5S or P1DT2H");
    let upper = text.trim_start_matches('+').to_ascii_uppercase();
    let rest = upper.strip_prefix('P').ok_or_else(bad)?;
    let (days, time) = match rest.split_once('T') {
        Some((d, t)) => (d, Some(t)),
        None => (rest, None),
    };
    let too_long = || format!("{text:?} is longer than any timeout");
    let mut total = Duration::ZERO;
    let mut add = |n: u64, secs: u64| -> Result<(), String> {
        let d = n.checked_mul(secs).map(Duration::from_secs).ok_or_else(too_long)?;
        total = total.checked_add(d).ok_or_else(too_long)?;
        Ok(())
    };
    if !days.is_empty() {
        let n: u64 = days.strip_suffix('D').ok_or_else(bad)?.parse().map_err(|_| bad())?;
        add(n, 86400)?;
    }
    let mut fraction = Duration::ZERO;
    if let Some(mut t) = time {
        if t.is_empty() {
            return Err(bad());
        }
        for (unit, secs) in [('H', 3600u64), ('M', 60)] {
            if let Some(i) = t.find(unit) {
                let n: u64 = t[..i].parse().map_err(|_| bad())?;
                add(n, secs)?;
                t = &t[i + 1..];
            }
        }
        if !t.is_empty() {
            let s = t.strip_suffix('S').ok_or_else(bad)?.replace(',', ".");
            fraction = decimal_seconds(&s).ok_or_else(bad)?;
        }
    } else if days.is_empty() {
        return Err(bad());
    }
    let total = total.checked_add(fraction).ok_or_else(too_long)?;
    Ok(total)
}

/// `12`, `0.25`, `15.000` seconds, exactly (nanosecond precision, no float rounding).
fn decimal_seconds(s: &str) -> Option<Duration> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if whole.is_empty() && frac.is_empty() || frac.len() > 9 {
        return None;
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: u64 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let nanos: u32 = if frac.is_empty() { 0 } else { format!("{frac:0<9}").parse().ok()? };
    Some(Duration::new(secs, nanos))
}

/// A Go / protobuf-JSON duration (Istio, Envoy): `1s`, `15.000s`, `0.25s`, `3m`,
/// `1h30m`, `100ms`; units `ns us µs ms s m h`. Envoy's proto-JSON form is seconds with a
/// fraction (`0.25s`); Istio also takes Go's forms (`3m`).
pub fn go_duration(text: &str) -> Result<Duration, String> {
    let bad = |why: &str| {
        format!("{text:?} is not a duration ({why}): expected e.g. 1s, 0.25s, 15.000s, 3m, 1h30m, 100ms")
    };
    let mut t = text.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.starts_with('-') {
        return Err(bad("negative"));
    }
    t = t.trim_start_matches('+');
    if t.is_empty() {
        return Err(bad("empty"));
    }
    let mut total = Duration::ZERO;
    while !t.is_empty() {
        let num_end =
            t.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(|| bad("missing unit"))?;
        let (num, rest) = t.split_at(num_end);
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let (unit, next) = rest.split_at(unit_end);
        let secs = decimal_seconds(num).ok_or_else(|| bad("bad number"))?;
        let scale: f64 = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad("unknown unit")),
        };
        let part = if unit == "s" {
            Some(secs)
        } else {
            Duration::try_from_secs_f64(secs.as_secs_f64() * scale).ok()
        };
        total = part.and_then(|p| total.checked_add(p)).ok_or_else(|| bad("too long"))?;
        t = next;
    }
    Ok(total)
}

/// A duration as Levee writes it (`1s`, `250ms`, `1m 30s`).
pub fn fmt_duration(d: Duration) -> String {
    levee_agent::policy::duration::format(d)
}

/// A number as the report writes it: no trailing `.0` noise for whole numbers.
pub fn fmt_num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 { format!("{}", v as i64) } else { format!("{v}") }
}

/// A Levee name (`a-z 0-9 . _ -`, 1..=64, starting with a letter or digit) for a source
/// name: a valid name is kept as is; otherwise each dot-separated part becomes kebab-case
/// (`backendA` → `backend-a`, `RSSAdd` → `rss-add`) and any other character becomes `-`
/// (`default/echo-service` → `default-echo-service`).
pub fn levee_name(source: &str) -> String {
    if check_name(source).is_ok() {
        return source.to_string();
    }
    let parts: Vec<String> = source.split('.').map(heck::AsKebabCase).map(|p| p.to_string()).collect();
    let mut out = String::new();
    for c in parts.join(".").chars() {
        let c = c.to_ascii_lowercase();
        let keep = c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '_' || c == '-';
        let c = if keep { c } else { '-' };
        if c == '-' && out.ends_with('-') {
            continue;
        }
        out.push(c);
    }
    let trimmed = out.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    let mut name: String = trimmed.chars().take(64).collect();
    while name.ends_with(['-', '.']) {
        name.pop();
    }
    if name.is_empty() { "unnamed".into() } else { name }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn spring_bare_numbers_are_milliseconds() {
        assert_eq!(spring_duration("100").unwrap(), ms(100));
        assert_eq!(spring_duration("10000").unwrap(), ms(10_000));
        assert_eq!(spring_duration("0").unwrap(), ms(0));
    }

    #[test]
    fn spring_units_and_iso8601() {
        assert_eq!(spring_duration("500ms").unwrap(), ms(500));
        assert_eq!(spring_duration("5s").unwrap(), ms(5000));
        assert_eq!(spring_duration("0s").unwrap(), ms(0));
        assert_eq!(spring_duration("1m").unwrap(), ms(60_000));
        assert_eq!(spring_duration("2H").unwrap(), ms(7_200_000));
        assert_eq!(spring_duration("PT90S").unwrap(), ms(90_000));
        assert_eq!(spring_duration("pt0.5s").unwrap(), ms(500));
        assert_eq!(spring_duration("P1DT2H3M4.5S").unwrap(), ms(86_400_000 + 7_200_000 + 180_000 + 4_500));
        for bad in [
            "1.5s",
            "-5s",
            "5 weeks",
            "PT",
            "P",
            "fast",
            "",
            "P18446744073709551615D",
            "PT99999999999999999H",
        ] {
            assert!(spring_duration(bad).is_err(), "{bad}");
        }
        assert!(spring_duration("1.5s").unwrap_err().contains("bare number in milliseconds"));
        assert!(spring_duration("-5s").unwrap_err().contains("bare number is milliseconds"));
    }

    #[test]
    fn go_and_protobuf_durations() {
        assert_eq!(go_duration("15.000s").unwrap(), ms(15_000));
        assert_eq!(go_duration("1.000s").unwrap(), ms(1000));
        assert_eq!(go_duration("0.25s").unwrap(), ms(250));
        assert_eq!(go_duration("0.1s").unwrap(), ms(100));
        assert_eq!(go_duration("3m").unwrap(), ms(180_000));
        assert_eq!(go_duration("1h30m").unwrap(), ms(5_400_000));
        assert_eq!(go_duration("100ms").unwrap(), ms(100));
        assert_eq!(go_duration("3600s").unwrap(), ms(3_600_000));
        assert_eq!(go_duration("1.5ms").unwrap(), Duration::from_micros(1500));
        for bad in ["5", "-1s", "1x", "s", "1.2.3s", "", "18446744073709551615h", "18446744073709551615s1s"] {
            assert!(go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_become_levee_names() {
        assert_eq!(levee_name("pricing"), "pricing");
        assert_eq!(levee_name("service_foo"), "service_foo");
        assert_eq!(levee_name("www.taobao.com"), "www.taobao.com");
        assert_eq!(levee_name("backendA"), "backend-a");
        assert_eq!(levee_name("RSSAdd"), "rss-add");
        assert_eq!(levee_name("retryLicenseService"), "retry-license-service");
        assert_eq!(levee_name("multipleRateLimiters_rps_limiter"), "multiple-rate-limiters-rps-limiter");
        assert_eq!(levee_name("default/echo-service"), "default-echo-service");
        assert_eq!(levee_name("httpbin.org"), "httpbin.org");
        assert_eq!(levee_name("???"), "unnamed");
        let long = levee_name(&"VeryLong".repeat(20));
        assert!(long.len() <= 64 && check_name(&long).is_ok(), "{long}");
    }
}
