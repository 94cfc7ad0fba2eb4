//! What several importers share: setting a dependency's field, walking a document with a
//! path, and the explanations of what Levee does differently (retry conditions, faults).

use std::time::Duration;

use levee_agent::policy::{DependencyPolicy, MIN_ATTEMPT_TIMEOUT, OutlierDetection};

use super::doc::{Node, Seg, path_text};
use super::plan::{Plan, Sid, dep_mut, dep_path};
use super::units::{fmt_duration, fmt_num};

/// Sets `field` of dependency `dep` from source settings.
pub fn set<V: Clone + 'static>(
    p: &mut Plan,
    dep: &str,
    field: &str,
    shown: impl Into<String>,
    sources: &[Sid],
    value: V,
    apply: fn(&mut DependencyPolicy, V),
) {
    let d = dep.to_string();
    p.assign(dep_path(dep, field), shown, sources, move |c| apply(dep_mut(c, &d), value.clone()));
}

/// Sets `field` of dependency `dep` to the source's own default (`why` says which;
/// `because` are the settings that make it apply).
#[expect(
    clippy::too_many_arguments,
    reason = "a thin forwarding helper; each argument is one piece of the report line"
)]
pub fn imply<V: Clone + 'static>(
    p: &mut Plan,
    dep: &str,
    field: &str,
    shown: impl Into<String>,
    why: impl Into<String>,
    because: &[Sid],
    value: V,
    apply: fn(&mut DependencyPolicy, V),
) {
    let d = dep.to_string();
    p.implied(dep_path(dep, field), shown, why, because, move |c| apply(dep_mut(c, &d), value.clone()));
}

/// Shorthand for a duration field.
pub fn set_duration(
    p: &mut Plan,
    dep: &str,
    field: &str,
    sources: &[Sid],
    d: Duration,
    apply: fn(&mut DependencyPolicy, Duration),
) {
    set(p, dep, field, fmt_duration(d), sources, d, apply);
}

/// A place in a document: the document number and the path from its root.
#[derive(Clone, Debug)]
pub struct At {
    pub doc: usize,
    pub path: Vec<Seg>,
}

impl At {
    pub fn root(doc: usize) -> Self {
        Self { doc, path: Vec::new() }
    }

    pub fn key(&self, k: &str) -> At {
        let mut path = self.path.clone();
        path.push(Seg::Key(k.to_string()));
        At { doc: self.doc, path }
    }

    pub fn index(&self, i: usize) -> At {
        let mut path = self.path.clone();
        path.push(Seg::Index(i));
        At { doc: self.doc, path }
    }

    pub fn text(&self) -> String {
        path_text(&self.path)
    }

    /// The setting here, if this place is a leaf of the document.
    pub fn sid(&self, p: &Plan) -> Option<Sid> {
        p.find(self.doc, &self.text())
    }
}

/// Marks every setting at or below `at` as not mapped (unless something maps it).
pub fn not_mapped_below(p: &mut Plan, at: &At, reason: &str) {
    for sid in p.below(at.doc, &at.text()) {
        p.not_mapped(sid, reason);
    }
}

/// Levee's retry conditions, as agent-semantics §2 fixes them.
pub const LEVEE_RETRY_ON: &str = "Levee's retry conditions are fixed: connect failures, resets, attempt \
timeouts, HTTP 502/503/504 and 429, gRPC UNAVAILABLE (RESOURCE_EXHAUSTED only with server pushback), \
and only for idempotent operations";

/// Explains a retry-condition list (Envoy `retry_on`, Istio `retryOn`): which conditions
/// Levee shares and which it never retries.
pub fn retry_on_reason(list: &str) -> String {
    let mut shared = Vec::new();
    let mut not = Vec::new();
    for c in list.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        let verdict: Result<(), &str> = match c {
            "connect-failure"
            | "reset"
            | "reset-before-request"
            | "refused-stream"
            | "gateway-error"
            | "unavailable"
            | "envoy-ratelimited"
            | "502"
            | "503"
            | "504"
            | "429" => Ok(()),
            "5xx" => Err("only 502/503/504 of the 5xx are retried"),
            "retriable-4xx" | "409" => Err("409 is a client error"),
            "resource-exhausted" => Err("only with server pushback"),
            "cancelled" | "deadline-exceeded" => {
                Err("never retried: the caller gave up or the deadline passed")
            }
            "internal" => Err("not retryable"),
            "retriable-status-codes" => Err("the status list is Levee's own fixed set"),
            "retriable-headers" => Err("no header-based conditions"),
            "http3-post-connect-failure" => Err("no HTTP/3 condition"),
            _ => Err("no such condition in Levee"),
        };
        match verdict {
            Ok(()) => shared.push(c.to_string()),
            Err(why) => not.push(format!("{c} ({why})")),
        }
    }
    let mut out = format!("{LEVEE_RETRY_ON}; no field holds a condition list");
    if !shared.is_empty() {
        out.push_str(&format!(". Covered by Levee: {}", shared.join(", ")));
    }
    if !not.is_empty() {
        out.push_str(&format!(". Not retried by Levee: {}", not.join(", ")));
    }
    out
}

/// What a fault of the source would be in Levee, and why the manifest does not hold it.
pub fn fault_reason(action: &str, percent: f64, deps: &[String]) -> String {
    let target = match deps {
        [] => "the dependencies it applies to".to_string(),
        [one] => format!("dependency {one}"),
        many => format!("dependencies {}", many.join(", ")),
    };
    format!(
        "fault injection is not part of a Levee manifest: a Levee fault rule is a game-day override that must \
         expire and is allowed only in environments with allow_faults. The equivalent rule: {action} on {} \
         percent of the attempts to {target} (PUT /api/v1/environments/ENV/services/SERVICE/faults/ID with \
         an expires_at)",
        fmt_num(percent)
    )
}

/// Reason for a Java exception class list or predicate (resilience4j, Hystrix).
pub const EXCEPTIONS: &str = "Levee classifies failures by error kind, not by exception class: connect \
errors, resets, attempt timeouts and 5xx count as failures, 4xx do not; there is no list to set";

/// A non-negative whole number from a node.
pub fn whole(n: &Node) -> Option<u64> {
    let v = n.as_f64()?;
    (v >= 0.0 && v.fract() == 0.0 && v <= u64::MAX as f64).then_some(v as u64)
}

/// Reasons the mesh importers (Envoy, Istio) and Hystrix share.
pub const CONNECT: &str = "Levee has no separate connect timeout: its attempt_timeout covers connecting and \
the response";
pub const QUEUE: &str = "a queue length: Levee's bulkhead bounds waiting by time (bulkhead.max_wait, 0 = fail \
fast), not by the number waiting";
pub const CONNECTIONS: &str = "a connection-pool setting: Levee bounds calls, not connections";
pub const CONCURRENT_RETRIES: &str = "a bound on concurrent retries: Levee bounds retries with a token-bucket \
retry budget (retry.budget: ratio of successes, min_retries_per_sec)";
pub const UNSPLIT: &str = "Levee counts connection failures and 5xx answers in one consecutive-error count \
(Envoy's default, unsplit mode); a separate local-origin count has no equivalent";
pub const ONE_COUNT: &str = "Levee has one consecutive-error count (5xx and connection failures), set from the \
5xx count";
pub const PANIC: &str = "Levee has no panic mode: it never ejects more than max_ejection_percent and always \
keeps one endpoint";
pub const WHOLE_REQUEST: &str = "timeout of the whole request across its retries: Levee bounds a whole call by \
the caller's deadline, and each attempt by attempt_timeout (from the per-try timeout)";

/// What a source's consecutive-error counts (Istio's `consecutive5xxErrors`,
/// `consecutiveGatewayErrors`, …) make of Levee's one count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCount<'k> {
    /// Set from this count: the first of the preference order that is written and is not 0.
    From(&'k str),
    /// Every count written is 0, and 0 turns that kind of ejection off: nothing ejects,
    /// so the manifest has no outlier detection (never Levee's default count in its place).
    Off,
    /// No count is written: the source's default count applies.
    Unset,
}

/// The one rule for a source's consecutive-error counts, `counts` in order of preference
/// with the value each has in the file: a count of 0 disables ejection on that kind of
/// error, so it never becomes Levee's count; a count that is not a whole number is still
/// the one chosen (it is then reported as not mapped).
pub fn error_count<'k>(counts: &[(&'k str, Option<&Node>)]) -> ErrorCount<'k> {
    let written: Vec<(&'k str, &Node)> = counts.iter().filter_map(|(k, n)| Some((*k, (*n)?))).collect();
    match written.iter().find(|(_, n)| whole(n) != Some(0)) {
        Some((k, _)) => ErrorCount::From(k),
        None if written.is_empty() => ErrorCount::Unset,
        None => ErrorCount::Off,
    }
}

/// Why a count of 0 is not Levee's count (another one is, or none: outlier detection off).
pub fn zero_count_reason(key: &str, chosen: Option<&str>) -> String {
    match chosen {
        Some(other) => format!(
            "{key}: 0 turns off ejection on these errors; Levee's one consecutive-error count is set from {other}"
        ),
        None => format!(
            "{key}: 0 turns off ejection on these errors and no other count ejects: the manifest has no outlier \
             detection (outlier_detection: null), not Levee's default count"
        ),
    }
}

/// Envoy's outlier-detection defaults, which Istio keeps: 5 consecutive errors, 10 s
/// interval, 30 s base ejection, at most 10 % ejected.
pub fn mesh_outlier_defaults() -> OutlierDetection {
    OutlierDetection {
        consecutive_errors: 5,
        interval: Duration::from_secs(10),
        base_ejection_time: Duration::from_secs(30),
        max_ejection_percent: 10,
    }
}

/// A route's timeouts (Envoy, Istio) and the attempts it makes, read before they are
/// mapped. Both sources bound the whole request, retries included, by the route timeout
/// and each attempt by the per-try timeout (which defaults to the route timeout).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// The source's name, for the notes ("Envoy", "Istio").
    pub source: &'static str,
    pub per_try: Option<(Duration, Sid)>,
    /// The route's whole-request timeout; `0s` turns it off.
    pub total: Option<(Duration, Sid)>,
    /// The source's whole-request timeout when the route sets none (Envoy's 15 s).
    pub default_total: Option<Duration>,
    /// Attempts in total, first included, as the import sets them.
    pub attempts: u32,
}

impl Timeouts {
    /// The bound on the whole request: the route's (not `0s`), else the source's default.
    fn bound(&self) -> Option<(Duration, Option<Sid>)> {
        match self.total {
            Some((d, _)) if d.is_zero() => None,
            Some((d, s)) => Some((d, Some(s))),
            None => self.default_total.map(|d| (d, None)),
        }
    }

    /// `total` split over the attempts: whole milliseconds, rounded down, at least
    /// Levee's minimum attempt timeout.
    fn split(&self, total: Duration) -> Duration {
        let n = u128::from(self.attempts.max(1));
        let ms = u64::try_from(total.as_millis() / n).unwrap_or(u64::MAX);
        Duration::from_millis(ms).max(MIN_ATTEMPT_TIMEOUT)
    }

    /// The attempt timeout the import sets, so that the attempts together never take
    /// longer than the source allows; `None` = the route bounds nothing (Levee's default
    /// stays).
    pub fn attempt_timeout(&self) -> Option<Duration> {
        let n = self.attempts.max(1);
        match (self.per_try, self.bound()) {
            (Some((d, _)), Some((t, _))) if d.saturating_mul(n) > t => Some(self.split(t)),
            (Some((d, _)), _) => Some(d),
            (None, Some((t, _))) => Some(self.split(t)),
            (None, None) => None,
        }
    }

    /// How a whole-request bound `t` became the attempt timeout `v`.
    fn split_note(&self, t: Duration, v: Duration) -> String {
        let n = self.attempts.max(1);
        let levee = "Levee has no total timeout per dependency: the caller's deadline bounds a whole call, \
                     retries included";
        let mut out = if n == 1 {
            format!(
                "{} bounds the whole request by {}; with one attempt that is the attempt timeout ({levee})",
                self.source,
                fmt_duration(t)
            )
        } else {
            format!(
                "{} bounds the whole request, retries included, by {}; {levee}, so it is split over the {n} \
                 attempts: attempt_timeout = {} / {n} = {} (whole milliseconds, rounded down), and the attempts \
                 together never take longer than the source allowed",
                self.source,
                fmt_duration(t),
                fmt_duration(t),
                fmt_duration(v)
            )
        };
        if v.saturating_mul(n) > t {
            out.push_str(&format!(
                "; {} is Levee's shortest attempt timeout, so {n} attempts may take {}",
                fmt_duration(v),
                fmt_duration(v.saturating_mul(n))
            ));
        }
        out
    }
}

/// Maps a route's timeouts onto `attempt_timeout` of `dep` ([`Timeouts::attempt_timeout`]),
/// with a note saying how. Returns `false` when the route and the source bound nothing
/// (the caller says that Levee's default applies).
pub fn route_timeout(p: &mut Plan, dep: &str, base: &[Sid], t: &Timeouts) -> bool {
    let with = |extra: &[Sid]| {
        let mut v = base.to_vec();
        v.extend(extra);
        v
    };
    let n = t.attempts.max(1);
    let Some(v) = t.attempt_timeout() else {
        return match t.total {
            Some((_, s)) => {
                p.not_mapped(
                    s,
                    "0s disables the timeout; Levee's timeouts are always finite (its default is kept)",
                );
                true
            }
            None => false,
        };
    };
    let bound = t.bound();
    match (t.per_try, bound) {
        (Some((d, ps)), Some((total, ts))) if v < d => {
            let whose = match ts {
                Some(_) => format!("the route timeout {}", fmt_duration(total)),
                None => format!("{}'s default route timeout {}", t.source, fmt_duration(total)),
            };
            p.note(
                ps,
                format!(
                    "{n} attempts × the per-try timeout {} = {} exceed {whose}, which bounds the whole request in {}: \
                     attempt_timeout is lowered to {} / {n} = {} (whole milliseconds, rounded down) so the total \
                     holds; the attempts are kept, so a quick failure is still retried as the source retries it. \
                     Levee bounds a whole call by the caller's deadline",
                    fmt_duration(d),
                    fmt_duration(d.saturating_mul(n)),
                    t.source,
                    fmt_duration(total),
                    fmt_duration(v)
                ),
            );
            let src: Vec<Sid> = std::iter::once(ps).chain(ts).collect();
            set_duration(p, dep, "attempt_timeout", &with(&src), v, |x, d| x.attempt_timeout = d);
        }
        (Some((d, ps)), _) => {
            set_duration(p, dep, "attempt_timeout", &with(&[ps]), d, |x, d| x.attempt_timeout = d);
            if let Some((_, s)) = t.total {
                let fits = match bound {
                    Some((total, _)) => format!(
                        "; {n} attempts × {} = {} fit within its {}",
                        fmt_duration(d),
                        fmt_duration(d.saturating_mul(n)),
                        fmt_duration(total)
                    ),
                    None => String::new(),
                };
                p.not_mapped(s, format!("{WHOLE_REQUEST}{fits}"));
            }
        }
        (None, Some((total, Some(s)))) => {
            p.note(s, t.split_note(total, v));
            set_duration(p, dep, "attempt_timeout", &with(&[s]), v, |x, d| x.attempt_timeout = d);
        }
        (None, Some((total, None))) => {
            let why = format!("{}'s default route timeout: {}", t.source, t.split_note(total, v));
            imply(p, dep, "attempt_timeout", fmt_duration(v), why, base, v, |x: &mut DependencyPolicy, d| {
                x.attempt_timeout = d
            });
        }
        (None, None) => return false,
    }
    true
}

/// Levee's attempts in total for a retry count (Envoy `num_retries`, Istio `attempts`).
pub fn retry_attempts(n: &Node) -> Option<u32> {
    whole(n).and_then(|k| u32::try_from(k).ok()).map(|k| k.saturating_add(1))
}

/// What a route sets for a dependency, in Levee's terms, to compare routes that send to
/// the same dependency.
pub fn route_summary(
    attempt_timeout: Option<Duration>,
    attempts: u32,
    back_off: Option<(Duration, Duration)>,
) -> String {
    let mut out = match attempt_timeout {
        Some(d) => format!("attempt_timeout = {}", fmt_duration(d)),
        None => "no attempt timeout (Levee's default)".to_string(),
    };
    out.push_str(&format!(", retry.max_attempts = {attempts}"));
    if let (true, Some((base, cap))) = (attempts > 1, back_off) {
        out.push_str(&format!(", retry.base = {}, retry.cap = {}", fmt_duration(base), fmt_duration(cap)));
    }
    out
}

/// The first route (in file order) that sets each dependency's timeout and retries.
/// Levee has one policy per dependency; a mesh may send several routes to one cluster or
/// host with different settings. The first route's settings are taken as a whole (never a
/// mix of fields from several routes), and a later route that differs is reported.
#[derive(Default)]
pub struct FirstRoute(std::collections::BTreeMap<String, (String, String)>);

impl FirstRoute {
    /// `Ok` when `route` is the first to send to `dep` or sets the same as the first;
    /// else why its settings are not taken (also noted for the whole import).
    pub fn claim(&mut self, p: &mut Plan, dep: &str, route: &str, summary: String) -> Result<(), String> {
        let (first, taken) =
            self.0.entry(dep.to_string()).or_insert_with(|| (route.to_string(), summary.clone())).clone();
        if taken == summary {
            return Ok(());
        }
        p.general_note(format!(
            "{dep}: routes {first} and {route} both send to it with different timeouts or retries; Levee keeps one \
             policy per dependency, and the first route's settings are taken as a whole ({taken}), not those of \
             {route} ({summary}). Give a route's own values to an operation (policy.dependencies.{dep}.operations) \
             by hand if its requests need them"
        ));
        Err(format!(
            "conflicts with {first} which already set the route settings of dependency {dep} ({taken}); this route \
             would set {summary}. Levee keeps one policy per dependency and takes the first route's settings as a \
             whole"
        ))
    }
}

/// Reason for the setting that names a route's destination (Envoy `route.cluster`, Istio
/// `destination.host`) when none of the route's settings is kept for it.
pub fn destination_reason(dep: &str) -> String {
    format!(
        "names the destination the route sends to: dependency {dep}, which the route's timeout and retry settings \
         apply to; none of this route's settings is in the manifest for it"
    )
}

/// A retry count (Envoy `num_retries`, Istio `attempts`) as Levee's attempts in total.
pub fn set_retries(p: &mut Plan, dep: &str, n: &Node, sid: Sid, base: &[Sid]) {
    let Some(attempts) = retry_attempts(n) else {
        p.not_mapped(sid, "not a whole number of retries");
        return;
    };
    let k = attempts - 1;
    p.note(
        sid,
        if k == 0 {
            "0 retries: one attempt".to_string()
        } else {
            format!("{k} retries = {attempts} attempts in total")
        },
    );
    let mut src = base.to_vec();
    src.push(sid);
    set(p, dep, "retry.max_attempts", attempts.to_string(), &src, attempts, |x: &mut DependencyPolicy, n| {
        x.retry.max_attempts = n
    });
}
