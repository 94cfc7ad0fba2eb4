//! Sentinel rules (JSON, comments allowed): flow rules, degrade rules (before and after
//! Sentinel 1.8) and system rules, told apart by their fields.
//!
//! A rule's `resource` names the dependency; `METHOD:https://host/path` (Sentinel's Feign
//! and RestTemplate adapters) becomes dependency `host`. Units: degrade `count` is a
//! response time in ms for slow-call rules and a ratio 0–1 for exception-ratio rules,
//! `slowRatioThreshold` is a ratio 0–1 (as Levee's thresholds), `timeWindow` is seconds,
//! `statIntervalMs` is milliseconds. A flow rule with `count: 0` blocks every call: it
//! becomes a kill switch (a bool flag set to false) on the dependency.

use std::time::Duration;

use levee_agent::policy::{DependencyPolicy, Flag, FlagType, LimitAlgorithm, StalePolicy, Window};

use super::common::{At, imply, not_mapped_below, set, set_duration};
use super::doc::{self, Node};
use super::plan::{Plan, Sid};
use super::report::Report;
use super::units::{fmt_duration, fmt_num};
use super::{ImportError, Source};
use crate::manifest::ServiceManifest;

const QPS: &str = "Levee has no QPS rate limiter: it bounds concurrency (bulkhead per dependency, adaptive \
limit inbound), not requests per second";

pub fn import(
    file: &str,
    text: &str,
    base: ServiceManifest,
) -> Result<(ServiceManifest, Report), ImportError> {
    let mut p = Plan::new(Source::Sentinel, file);
    let root = doc::parse_json_with_comments(text)?;
    let Node::Seq(rules) = &root else {
        return Err(ImportError::Shape(
            "a Sentinel rule file is a JSON array of rules (flow, degrade or system rules)".into(),
        ));
    };
    doc::register(&mut p, std::slice::from_ref(&root));
    for (i, rule) in rules.iter().enumerate() {
        let at = At::root(0).index(i);
        let has = |k: &str| rule.get(k).is_some();
        if ["highestSystemLoad", "highestCpuUsage", "avgRt", "maxThread", "qps"].iter().any(|k| has(k)) {
            system_rule(&mut p, &at, rule);
        } else if has("paramIdx") {
            not_mapped_below(
                &mut p,
                &at,
                "a hot-parameter flow rule: Levee has no per-argument rate limiting",
            );
        } else if has("timeWindow") {
            degrade_rule(&mut p, &at, rule);
        } else if has("count") || has("grade") {
            flow_rule(&mut p, &at, rule);
        } else if has("strategy") && has("limitApp") {
            not_mapped_below(
                &mut p,
                &at,
                "an authority (caller allow/deny) rule: Levee authenticates agents, not callers",
            );
        } else {
            not_mapped_below(&mut p, &at, "not a Sentinel flow, degrade or system rule");
        }
    }
    p.finish(base, &|_| "not read by the Sentinel importer".into())
}

/// The dependency for a Sentinel resource: the host of `METHOD:scheme://host/path` or of a
/// URL, else the resource itself.
pub fn resource_dependency(resource: &str) -> String {
    let rest = match resource.split_once(':') {
        Some((m, r)) if !m.is_empty() && m.chars().all(|c| c.is_ascii_uppercase()) => r,
        _ => resource,
    };
    if let Some((_, after)) = rest.split_once("://") {
        let host = after.split(['/', '?', '#']).next().unwrap_or(after);
        let host = host.rsplit('@').next().unwrap_or(host);
        let host = host.split(':').next().unwrap_or(host);
        if !host.is_empty() {
            return host.to_string();
        }
    }
    resource.to_string()
}

fn resource(p: &mut Plan, at: &At, rule: &Node) -> Option<(String, Sid)> {
    let r = rule.get("resource").and_then(Node::as_str)?;
    let sid = at.key("resource").sid(p)?;
    let name = resource_dependency(r);
    if name != r {
        p.note(sid, format!("the resource's host {name:?} names the dependency"));
    }
    Some((p.dep_name(&name), sid))
}

fn num(rule: &Node, k: &str) -> Option<f64> {
    rule.get(k).and_then(Node::as_f64)
}

fn flow_rule(p: &mut Plan, at: &At, rule: &Node) {
    let grade = num(rule, "grade").unwrap_or(1.0);
    let count = num(rule, "count");
    let Some((dep, rsid)) = resource(p, at, rule) else {
        not_mapped_below(p, at, "a flow rule without a resource");
        return;
    };
    let strategy = num(rule, "strategy").unwrap_or(0.0);
    let limit_app = rule.get("limitApp").and_then(Node::as_str).unwrap_or("default");
    let behaviour = num(rule, "controlBehavior").unwrap_or(0.0);
    if strategy != 0.0
        || limit_app != "default"
        || rule.get("clusterMode").and_then(Node::as_bool) == Some(true)
    {
        not_mapped_below(
            p,
            at,
            "a rule for one caller (limitApp), relative to another resource (strategy 1/2) or cluster-wide: no \
             Levee equivalent",
        );
        return;
    }
    let count_sid = at.key("count").sid(p);
    let mut sel: Vec<Sid> = vec![rsid];
    sel.extend(at.key("grade").sid(p));
    sel.extend(at.key("strategy").sid(p));
    sel.extend(at.key("limitApp").sid(p));
    sel.extend(at.key("controlBehavior").sid(p));
    if count == Some(0.0) {
        let flag = format!("{dep}.enabled");
        let mut src = sel.clone();
        src.extend(count_sid);
        if let Some(s) = count_sid {
            p.note(s, "count 0 lets no call through: imported as a kill switch that is off");
        }
        let d = dep.clone();
        let f = flag.clone();
        p.assign(format!("policy.dependencies.{dep}.enabled_flag"), flag.clone(), &src, move |c| {
            super::plan::dep_mut(c, &d).enabled_flag = Some(f.clone())
        });
        let resource_name = rule.get("resource").map(Node::text).unwrap_or_default();
        p.assign(format!("flags.{flag}"), "{type: bool, value: false}", &src, move |c| {
            c.flags.insert(
                flag.clone(),
                Flag {
                    kind: FlagType::Bool,
                    value: serde_json::Value::Bool(false),
                    description: format!(
                        "Kill switch imported from a Sentinel flow rule with count 0 on {resource_name}"
                    ),
                    owner: String::new(),
                    expires_at: None,
                    stale: StalePolicy::Hold,
                    rollout: None,
                },
            );
        });
        return;
    }
    if grade != 0.0 {
        not_mapped_below(p, at, QPS);
        return;
    }
    if behaviour != 0.0 {
        not_mapped_below(
            p,
            at,
            "warm-up or queueing (controlBehavior 1-3): Levee's bulkhead rejects at once or waits max_wait",
        );
        return;
    }
    match (count, count_sid) {
        (Some(c), Some(s)) if c.fract() == 0.0 && c >= 0.0 && c <= f64::from(u32::MAX) => {
            let n = c as u32;
            p.note(s, "a thread-count (grade 0) flow rule bounds concurrent calls, as Levee's bulkhead does");
            let mut src = sel;
            src.push(s);
            set(p, &dep, "bulkhead.max_concurrent", n.to_string(), &src, n, |x: &mut DependencyPolicy, n| {
                x.bulkhead.max_concurrent = n
            });
        }
        (Some(c), Some(s)) => {
            p.not_mapped(s, format!("{} is not a whole number of concurrent calls", fmt_num(c)))
        }
        _ => {}
    }
    not_mapped_below(p, &at.key("maxQueueingTimeMs"), "queueing is off (controlBehavior 0)");
    not_mapped_below(p, &at.key("warmUpPeriodSec"), "warm-up is off (controlBehavior 0)");
}

fn degrade_rule(p: &mut Plan, at: &At, rule: &Node) {
    let Some((dep, rsid)) = resource(p, at, rule) else {
        not_mapped_below(p, at, "a degrade rule without a resource");
        return;
    };
    let grade = num(rule, "grade").unwrap_or(0.0);
    let count = num(rule, "count");
    let count_sid = at.key("count").sid(p);
    let mut sel = vec![rsid];
    sel.extend(at.key("grade").sid(p));
    let with = |s: Option<Sid>| {
        let mut v = sel.clone();
        v.extend(s);
        v
    };
    if grade == 2.0 {
        not_mapped_below(
            p,
            at,
            "an exception-count rule (grade 2): Levee's breaker trips on a failure rate over a window with a \
             minimum of calls, not on an absolute count",
        );
        return;
    }
    let legacy = rule.get("passCount").is_some() && rule.get("slowRatioThreshold").is_none();
    if let Some(s) = at.key("passCount").sid(p) {
        p.not_mapped(s, "obsolete field of Sentinel before 1.8; Sentinel 1.8 and later ignore it");
    }
    if grade == 0.0 {
        let Some(c) = count.filter(|c| *c >= 0.0 && c.fract() == 0.0) else {
            if let Some(s) = count_sid {
                p.not_mapped(s, "not a whole number of milliseconds");
            }
            return;
        };
        let slow = Duration::from_millis((c as u64).saturating_add(1));
        if let Some(s) = count_sid {
            p.note(
                s,
                format!(
                    "Sentinel counts a call as slow when its RT exceeds {} ms; Levee when it lasts at least \
                     slow_call_duration, so {} ms + 1 ms",
                    fmt_num(c),
                    fmt_num(c)
                ),
            );
            if legacy {
                p.note(
                    s,
                    "written for Sentinel before 1.8 (average-RT rule); imported as Sentinel 1.8+ reads it: a \
                     slow-call-ratio breaker",
                );
            }
        }
        set(
            p,
            &dep,
            "circuit_breaker.slow_call_duration",
            fmt_duration(slow),
            &with(count_sid),
            Some(slow),
            |x: &mut DependencyPolicy, d| x.circuit_breaker.slow_call_duration = d,
        );
        let ratio_sid = at.key("slowRatioThreshold").sid(p);
        match num(rule, "slowRatioThreshold") {
            Some(r) => {
                if let Some(s) = ratio_sid {
                    p.note(s, "a ratio 0-1, as Levee's; Sentinel opens above it, Levee at or above it");
                }
                set(
                    p,
                    &dep,
                    "circuit_breaker.slow_call_rate_threshold",
                    fmt_num(r),
                    &with(ratio_sid),
                    r,
                    |x: &mut DependencyPolicy, r| x.circuit_breaker.slow_call_rate_threshold = r,
                );
            }
            None => imply(
                p,
                &dep,
                "circuit_breaker.slow_call_rate_threshold",
                "1",
                "Sentinel's default slowRatioThreshold (1.0)",
                &with(count_sid),
                1.0f64,
                |x: &mut DependencyPolicy, r| x.circuit_breaker.slow_call_rate_threshold = r,
            ),
        }
        imply(
            p,
            &dep,
            "circuit_breaker.failure_rate_threshold",
            "1",
            "a Sentinel slow-call rule does not trip on errors; Levee always does, so only at 100% failures",
            &sel,
            1.0f64,
            |x: &mut DependencyPolicy, r| x.circuit_breaker.failure_rate_threshold = r,
        );
    } else if grade == 1.0 {
        if let (Some(r), Some(s)) = (count, count_sid) {
            p.note(s, "an exception ratio 0-1, as Levee's failure_rate_threshold");
            set(
                p,
                &dep,
                "circuit_breaker.failure_rate_threshold",
                fmt_num(r),
                &with(count_sid),
                r,
                |x: &mut DependencyPolicy, r| x.circuit_breaker.failure_rate_threshold = r,
            );
        }
    } else {
        not_mapped_below(
            p,
            at,
            "unknown degrade grade (0 slow-call ratio, 1 exception ratio, 2 exception count)",
        );
        return;
    }
    match (num(rule, "timeWindow"), at.key("timeWindow").sid(p)) {
        (Some(w), Some(s)) if w >= 0.0 && w.fract() == 0.0 => {
            let d = Duration::from_secs(w as u64);
            p.note(s, "seconds; Sentinel keeps the open period constant, so Levee's growth is capped at it");
            let src = with(Some(s));
            set_duration(p, &dep, "circuit_breaker.wait_in_open", &src, d, |x, d| {
                x.circuit_breaker.wait_in_open = d
            });
            set_duration(p, &dep, "circuit_breaker.max_wait_in_open", &src, d, |x, d| {
                x.circuit_breaker.max_wait_in_open = d
            });
        }
        (Some(_), Some(s)) => p.not_mapped(s, "not a whole number of seconds"),
        _ => {}
    }
    let min_sid = at.key("minRequestAmount").sid(p);
    match num(rule, "minRequestAmount") {
        Some(m) if m >= 1.0 && m.fract() == 0.0 && m <= f64::from(u32::MAX) => {
            let m = m as u32;
            set(
                p,
                &dep,
                "circuit_breaker.minimum_calls",
                m.to_string(),
                &with(min_sid),
                m,
                |x: &mut DependencyPolicy, m| x.circuit_breaker.minimum_calls = m,
            );
        }
        Some(_) => {
            if let Some(s) = min_sid {
                p.not_mapped(s, "Levee's minimum_calls is a whole number from 1");
            }
        }
        None => imply(
            p,
            &dep,
            "circuit_breaker.minimum_calls",
            "5",
            "Sentinel's default minRequestAmount",
            &sel,
            5u32,
            |x: &mut DependencyPolicy, m| x.circuit_breaker.minimum_calls = m,
        ),
    }
    let stat_sid = at.key("statIntervalMs").sid(p);
    match num(rule, "statIntervalMs") {
        Some(ms) if ms >= 1000.0 && ms % 1000.0 == 0.0 && ms / 1000.0 <= f64::from(u32::MAX) => {
            let secs = (ms / 1000.0) as u32;
            set(
                p,
                &dep,
                "circuit_breaker.window",
                format!("{{type: time, seconds: {secs}}}"),
                &with(stat_sid),
                Window::Time { seconds: secs },
                |x: &mut DependencyPolicy, w| x.circuit_breaker.window = w,
            );
        }
        Some(ms) => {
            if let Some(s) = stat_sid {
                p.not_mapped(s, format!("{} ms: Levee's time window counts whole seconds", fmt_num(ms)));
            }
        }
        None => imply(
            p,
            &dep,
            "circuit_breaker.window",
            "{type: time, seconds: 1}",
            "Sentinel's default statIntervalMs (1000)",
            &sel,
            Window::Time { seconds: 1 },
            |x: &mut DependencyPolicy, w| x.circuit_breaker.window = w,
        ),
    }
    imply(
        p,
        &dep,
        "circuit_breaker.half_open_probes",
        "1",
        "Sentinel lets one probe call through when half-open",
        &sel,
        1u32,
        |x: &mut DependencyPolicy, n| x.circuit_breaker.half_open_probes = n,
    );
    not_mapped_below(
        p,
        &at.key("rtSlowRequestAmount"),
        "obsolete field of Sentinel before 1.8; Sentinel 1.8 and later ignore it",
    );
}

fn system_rule(p: &mut Plan, at: &At, rule: &Node) {
    let unset = "-1 means not set";
    for k in ["highestSystemLoad", "highestCpuUsage"] {
        if let Some(s) = at.key(k).sid(p) {
            if num(rule, k).is_some_and(|v| v < 0.0) {
                p.not_mapped(s, unset);
            } else {
                p.not_mapped(s, "Levee sheds by concurrency and criticality, not by system load or CPU");
            }
        }
    }
    if let Some(s) = at.key("qps").sid(p) {
        p.not_mapped(s, if num(rule, "qps").is_some_and(|v| v < 0.0) { unset } else { QPS });
    }
    if let Some(s) = at.key("avgRt").sid(p) {
        p.not_mapped(
            s,
            if num(rule, "avgRt").is_some_and(|v| v < 0.0) {
                unset
            } else {
                "Levee's adaptive limits (gradient2, vegas) react to latency; there is no average-RT threshold"
            },
        );
    }
    if let Some(s) = at.key("maxThread").sid(p) {
        match num(rule, "maxThread") {
            Some(v) if v < 0.0 => p.not_mapped(s, unset),
            Some(v) if v.fract() == 0.0 && v <= f64::from(u32::MAX) => {
                let n = v as u32;
                p.note(
                    s,
                    "Sentinel's system maxThread bounds concurrent inbound requests: a fixed inbound limit",
                );
                p.assign("policy.inbound.limit.algorithm".into(), "fixed", &[s], |c| {
                    c.policy.inbound.limit.algorithm = LimitAlgorithm::Fixed
                });
                p.assign("policy.inbound.limit.initial_limit".into(), n.to_string(), &[s], move |c| {
                    c.policy.inbound.limit.initial_limit = n
                });
            }
            _ => p.not_mapped(s, "not a whole number of threads"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_name_their_host() {
        assert_eq!(resource_dependency("GET:https://httpbin.org/status/500"), "httpbin.org");
        assert_eq!(resource_dependency("http://www.taobao.com"), "www.taobao.com");
        assert_eq!(resource_dependency("POST:http://user@svc:8080/x"), "svc");
        assert_eq!(resource_dependency("abc"), "abc");
        assert_eq!(resource_dependency("com.shop.Pricing:quote"), "com.shop.Pricing:quote");
    }
}
