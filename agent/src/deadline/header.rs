use std::time::Duration;

use http::HeaderMap;

use crate::policy::Criticality;

use super::Deadline;

/// gRPC's deadline header (`grpc-timeout`): 1 to 8 ASCII digits and a unit.
pub const GRPC_TIMEOUT_HEADER: &str = "grpc-timeout";
/// Levee's HTTP deadline header: the caller's *remaining* budget in whole milliseconds
/// (relative, so clock differences between hosts do not matter).
pub const DEADLINE_MS_HEADER: &str = "levee-deadline-ms";
/// Header (and gRPC metadata key) carrying the request's criticality, with the SRE book's
/// names: `CRITICAL_PLUS`, `CRITICAL`, `SHEDDABLE_PLUS`, `SHEDDABLE`.
pub const CRITICALITY_HEADER: &str = "levee-criticality";
/// Smallest inbound budget: a zero or sub-millisecond budget sent by a caller is raised to
/// this (the request is as good as expired, but it is never mistaken for "no deadline").
pub const MIN_INBOUND_BUDGET: Duration = Duration::from_millis(1);

/// Parses a `grpc-timeout` value: 1 to 8 ASCII digits followed by one unit of `H` (hours),
/// `M` (minutes), `S` (seconds), `m` (milliseconds), `u` (microseconds), `n` (nanoseconds),
/// as the gRPC over HTTP/2 spec defines it.
///
/// Returns `None` for anything else (empty, sign, spaces, 9+ digits, unknown unit,
/// non-ASCII); never panics. The result may be zero; [`inbound_deadline`] clamps it.
pub fn parse_grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    let n = parse_digits(digits, 8)?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Parses a `levee-deadline-ms` value: 1 to 18 ASCII digits, milliseconds.
///
/// Returns `None` for anything else (negative, fractional, spaces, non-numeric, too many
/// digits); never panics. The result may be zero; [`inbound_deadline`] clamps it.
pub fn parse_deadline_ms(value: &[u8]) -> Option<Duration> {
    parse_digits(value, 18).map(Duration::from_millis)
}

fn parse_digits(digits: &[u8], max_len: usize) -> Option<u64> {
    if digits.is_empty() || digits.len() > max_len {
        return None;
    }
    let mut n: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        // At most 18 digits: cannot overflow a u64.
        n = n * 10 + u64::from(b - b'0');
    }
    Some(n)
}

/// Formats a budget as a `grpc-timeout` value in the finest unit whose value fits in
/// 8 digits, truncating (never rounding up). Zero becomes `1n`.
pub(super) fn format_grpc_timeout(budget: Duration) -> String {
    const MAX: u128 = 99_999_999;
    let nanos = budget.as_nanos().max(1);
    let units: [(u128, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    for (scale, unit) in units {
        let v = nanos / scale;
        if v <= MAX {
            return format!("{}{unit}", v.max(1));
        }
    }
    format!("{MAX}H")
}

/// The value of header `name` when it appears exactly once; a repeated header is treated
/// as malformed (a caller sending two budgets is trusted with neither).
fn single<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => Some(v.as_bytes()),
        _ => None,
    }
}

/// The budget the caller of an inbound request sent: `grpc-timeout` when present and well
/// formed, else `levee-deadline-ms`; clamped to `MIN_INBOUND_BUDGET..=max` (zero is raised,
/// huge values are capped). `None` when the caller sent none (a malformed or repeated value
/// counts as none). Never panics on any header content.
pub fn caller_budget(headers: &HeaderMap, max: Duration) -> Option<Duration> {
    let sent = single(headers, GRPC_TIMEOUT_HEADER)
        .and_then(parse_grpc_timeout)
        .or_else(|| single(headers, DEADLINE_MS_HEADER).and_then(parse_deadline_ms))?;
    Some(sent.clamp(MIN_INBOUND_BUDGET, max.max(MIN_INBOUND_BUDGET)))
}

/// The deadline of an inbound request (agent-semantics §1): the [`caller_budget`], else
/// `default_budget` (capped by `max` too). Never panics on any header content.
pub fn inbound_deadline(headers: &HeaderMap, max: Duration, default_budget: Duration) -> Deadline {
    inbound_budget(headers, max, default_budget).0
}

/// [`inbound_deadline`], and whether the caller sent it (`false`: the service's default).
pub(crate) fn inbound_budget(
    headers: &HeaderMap,
    max: Duration,
    default_budget: Duration,
) -> (Deadline, bool) {
    match caller_budget(headers, max) {
        Some(b) => (Deadline::after(b), true),
        None => {
            (Deadline::after(default_budget.clamp(MIN_INBOUND_BUDGET, max.max(MIN_INBOUND_BUDGET))), false)
        }
    }
}

/// Parses a `levee-criticality` value (SRE names, ASCII case-insensitive, surrounding
/// spaces ignored). `None` for an unknown name.
pub fn parse_criticality(value: &[u8]) -> Option<Criticality> {
    let v = value.trim_ascii();
    [Criticality::CriticalPlus, Criticality::Critical, Criticality::SheddablePlus, Criticality::Sheddable]
        .into_iter()
        .find(|c| format_criticality(*c).as_bytes().eq_ignore_ascii_case(v))
}

/// The header value of a criticality: `CRITICAL_PLUS`, `CRITICAL`, `SHEDDABLE_PLUS` or
/// `SHEDDABLE`.
pub const fn format_criticality(c: Criticality) -> &'static str {
    match c {
        Criticality::CriticalPlus => "CRITICAL_PLUS",
        Criticality::Critical => "CRITICAL",
        Criticality::SheddablePlus => "SHEDDABLE_PLUS",
        Criticality::Sheddable => "SHEDDABLE",
    }
}
