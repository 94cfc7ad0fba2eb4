//! What several importers share: setting a dependency's field, walking a document with a
//! path, and the explanations of what Levee does differently (retry conditions, faults).

use std::time::Duration;

use levee_agent::policy::{DependencyPolicy, OutlierDetection};

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

/// A route's timeouts as Envoy and Istio apply them: the per-try timeout bounds an attempt;
/// without one, each attempt may use the route timeout. Returns `false` when the route sets
/// neither (the caller applies its source's default).
pub fn route_timeout(
    p: &mut Plan,
    dep: &str,
    base: &[Sid],
    per_try: Option<(Duration, Sid)>,
    timeout: Option<(Duration, Sid)>,
    retrying: bool,
) -> bool {
    let with = |s: Sid| {
        let mut v = base.to_vec();
        v.push(s);
        v
    };
    match (per_try, timeout) {
        (Some((d, s)), t) => {
            set_duration(p, dep, "attempt_timeout", &with(s), d, |x, d| x.attempt_timeout = d);
            if let Some((_, ts)) = t {
                p.not_mapped(ts, WHOLE_REQUEST);
            }
        }
        (None, Some((d, s))) if d.is_zero() => {
            p.not_mapped(
                s,
                "0s disables the timeout; Levee's timeouts are always finite (its default is kept)",
            );
        }
        (None, Some((d, s))) => {
            if retrying {
                p.note(s, "with no per-try timeout, each attempt may use the whole route timeout");
            }
            set_duration(p, dep, "attempt_timeout", &with(s), d, |x, d| x.attempt_timeout = d);
        }
        (None, None) => return false,
    }
    true
}

/// A retry count (Envoy `num_retries`, Istio `attempts`) as Levee's attempts in total.
pub fn set_retries(p: &mut Plan, dep: &str, n: &Node, sid: Sid, base: &[Sid]) {
    let Some(k) = whole(n).and_then(|k| u32::try_from(k).ok()) else {
        p.not_mapped(sid, "not a whole number of retries");
        return;
    };
    let attempts = k.saturating_add(1);
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
