//! resilience4j (Spring Boot): `resilience4j.<module>.configs|instances.<name>.<setting>`.
//!
//! Each instance name becomes a Levee dependency that gathers the instance's circuit
//! breaker, retry, bulkhead and time limiter. An instance inherits its `baseConfig`, or
//! `configs.default` when it names none, and its own settings win. Where the file relies
//! on a resilience4j default that differs from Levee's (minimum calls 100, 60 s open, 10
//! half-open calls, 500 ms retry wait, a constant open period), that default is applied
//! and noted. Durations: a bare number is milliseconds; `5s`, `500ms`, `PT90S` as Spring
//! reads them. Percentages (`failureRateThreshold: 50`) become Levee ratios (0.5).

use std::collections::BTreeMap;
use std::time::Duration;

use levee_agent::policy::{DependencyPolicy, Window};

use super::common::{EXCEPTIONS, LEVEE_RETRY_ON, imply, set, set_duration};
use super::plan::{Plan, Sid};
use super::report::Report;
use super::spring::{self, Prop, canon};
use super::units::{fmt_duration, fmt_num, spring_duration};
use super::{ImportError, Source};
use crate::manifest::ServiceManifest;

const MODULES_WITH_POLICY: [&str; 5] =
    ["circuitbreaker", "retry", "bulkhead", "threadpoolbulkhead", "timelimiter"];

const HEALTH: &str = "Spring health indicator: Levee's readiness() depends on its critical dependencies, \
with no per-breaker switch";
const EVENTS: &str = "size of the actuator's event buffer: Levee reports transitions as metrics and to the \
server";
const JAVA: &str = "Java-only setting (stack traces, thread context): nothing to set in Levee";
const RATE: &str = "Levee has no client-side rate limiter: it bounds concurrency (bulkhead per dependency, \
adaptive limit inbound), not calls per period";

/// One setting value of an instance after inheritance.
#[derive(Clone, Debug, Default)]
struct Val {
    value: Option<String>,
    /// The settings that hold the value.
    own: Vec<Sid>,
    /// `own` plus the settings that bring it to the instance (`baseConfig`, a gateway
    /// filter naming the instance): what an assignment from this value is mapped from.
    sources: Vec<Sid>,
}

#[derive(Debug, Default)]
struct Group {
    /// Setting name (relaxed) → its props (several for a list written with indices).
    props: BTreeMap<String, Vec<Prop>>,
    /// Settings that name this instance elsewhere (Spring Cloud Gateway filters).
    named_by: Vec<Sid>,
}

#[derive(Debug, Default)]
struct Module {
    configs: BTreeMap<String, Group>,
    instances: BTreeMap<String, Group>,
}

pub fn import(
    file: &str,
    text: &str,
    base: ServiceManifest,
) -> Result<(ServiceManifest, Report), ImportError> {
    let mut p = Plan::new(Source::Resilience4j, file);
    let props = spring::read(&mut p, text)?;
    let mut modules: BTreeMap<String, Module> = BTreeMap::new();
    for pr in &props {
        if spring::application_name(&mut p, pr) {
            continue;
        }
        if pr.canon(0) != "resilience4j" {
            continue;
        }
        let module = pr.canon(1);
        let section = pr.canon(2);
        let is_group = matches!(section.as_str(), "configs" | "instances" | "backends" | "limiters");
        if !is_group || pr.keys.len() < 5 {
            let written = pr.keys.get(1).map_or("", String::as_str);
            let reason = if section == "tags" {
                "metric tags: Levee's metrics are labelled by service, dependency and operation".to_string()
            } else if section.ends_with("aspectorder") {
                "order of the Spring annotations: Levee's order of enforcement is fixed (bulkhead, retry, \
                 circuit breaker, attempt timeout), see docs/patterns.md"
                    .to_string()
            } else if !MODULES_WITH_POLICY.contains(&module.as_str()) && module != "ratelimiter" {
                not_policy(written)
            } else {
                format!("resilience4j.{written} setting outside configs/instances: no Levee equivalent")
            };
            p.not_mapped(pr.sid, reason);
            continue;
        }
        if section == "backends" || section == "limiters" {
            p.note(pr.sid, format!("`{}` is resilience4j's legacy name of `instances`", pr.keys[2]));
        }
        let m = modules.entry(module).or_default();
        let groups = if section == "configs" { &mut m.configs } else { &mut m.instances };
        let g = groups.entry(pr.keys[3].clone()).or_default();
        g.props.entry(pr.canon(4)).or_default().push(pr.clone());
    }
    gateway_instances(&mut p, &props, &mut modules);

    let mut dependencies: BTreeMap<String, String> = BTreeMap::new();
    for (name, m) in &modules {
        if !MODULES_WITH_POLICY.contains(&name.as_str()) {
            continue;
        }
        for inst in m.instances.keys() {
            let dep = p.dep_name(inst);
            dependencies.insert(inst.clone(), dep);
        }
    }
    let semaphore_names: Vec<String> =
        modules.get("bulkhead").map(|m| m.instances.keys().cloned().collect()).unwrap_or_default();

    for (name, m) in &modules {
        for (inst, g) in &m.instances {
            let eff = effective(&mut p, m, g);
            let handled: Vec<String> = match name.as_str() {
                "circuitbreaker" => breaker(&mut p, &dependencies[inst], &eff),
                "retry" => retry(&mut p, &dependencies[inst], &eff),
                "bulkhead" => bulkhead(&mut p, &dependencies[inst], &eff),
                "threadpoolbulkhead" => {
                    thread_pool(&mut p, &dependencies[inst], &eff, semaphore_names.contains(inst))
                }
                "timelimiter" => time_limiter(&mut p, &dependencies[inst], &eff),
                other => {
                    let reason = if other == "ratelimiter" { RATE.to_string() } else { not_policy(other) };
                    for pr in g.props.values().flatten() {
                        p.not_mapped(pr.sid, reason.clone());
                    }
                    for v in eff.values() {
                        not_mapped(&mut p, v, &reason);
                    }
                    continue;
                }
            };
            for (prop, v) in &eff {
                if !handled.contains(prop) {
                    not_mapped(&mut p, v, &format!("not a resilience4j {name} setting Levee knows"));
                }
            }
            if let Some(b) = g.props.get("baseconfig").and_then(|v| v.first()) {
                p.not_mapped(
                    b.sid,
                    format!(
                        "nothing of config {:?} reaches Levee for instance {inst:?}: overridden, or not mapped (see \
                         the config's settings)",
                        b.value.clone().unwrap_or_default()
                    ),
                );
            }
        }
        if !MODULES_WITH_POLICY.contains(&name.as_str()) {
            let reason = if name == "ratelimiter" { RATE.to_string() } else { not_policy(name) };
            for g in m.configs.values() {
                for pr in g.props.values().flatten() {
                    p.not_mapped(pr.sid, reason.clone());
                }
            }
        }
    }
    for (name, m) in &modules {
        config_reasons(&mut p, name, m);
    }
    p.finish(base, &fallback)
}

fn not_policy(module: &str) -> String {
    format!("resilience4j.{module} configures executors or metrics, not a resilience policy")
}

fn fallback(path: &str) -> String {
    if canon(path).starts_with("spring.cloud.gateway") {
        "Spring Cloud Gateway setting, not resilience4j: its Retry filter, rate limiter and HTTP client \
         timeouts are not imported"
            .into()
    } else {
        "not a resilience4j setting".into()
    }
}

fn not_mapped(p: &mut Plan, v: &Val, reason: &str) {
    for &s in &v.own {
        p.not_mapped(s, reason);
    }
}

/// A gateway route filter: its name, and the instance name it gives (with its setting).
type Filter = (Option<String>, Option<(String, Sid)>);

/// Spring Cloud Gateway creates a circuit breaker and a time limiter per `CircuitBreaker`
/// route filter, named by its `args.name` (or `CircuitBreaker=name`), from `configs.default`.
fn gateway_instances(p: &mut Plan, props: &[Prop], modules: &mut BTreeMap<String, Module>) {
    let mut filters: BTreeMap<Vec<String>, Filter> = BTreeMap::new();
    for pr in props {
        let c: Vec<String> = pr.keys.iter().map(|k| canon(k)).collect();
        if c.len() < 7 || c[..4] != ["spring", "cloud", "gateway", "routes"] || c[5] != "filters" {
            continue;
        }
        let key = c[..7].to_vec();
        let rest = c[7..].join(".");
        let value = pr.value.clone().unwrap_or_default();
        let entry = filters.entry(key).or_default();
        match rest.as_str() {
            "name" => entry.0 = Some(value),
            "args.name" => entry.1 = Some((value, pr.sid)),
            "" => {
                if let Some((kind, arg)) = value.split_once('=') {
                    entry.0 = Some(kind.trim().to_string());
                    entry.1 = Some((arg.split(',').next().unwrap_or("").trim().to_string(), pr.sid));
                }
            }
            _ => {}
        }
    }
    for (kind, name) in filters.into_values() {
        let (Some(kind), Some((name, sid))) = (kind, name) else { continue };
        if kind != "CircuitBreaker" || name.is_empty() {
            continue;
        }
        p.general_note(format!(
            "Spring Cloud Gateway's CircuitBreaker filter creates the resilience4j circuit breaker and time \
             limiter {name:?} from configs.default"
        ));
        for module in ["circuitbreaker", "timelimiter"] {
            let m = modules.entry(module.into()).or_default();
            m.instances.entry(name.clone()).or_default().named_by.push(sid);
        }
    }
}

/// The instance's settings after inheritance: its base config (`baseConfig`, else
/// `configs.default`), overridden by its own settings.
fn effective(p: &mut Plan, m: &Module, g: &Group) -> BTreeMap<String, Val> {
    let mut eff: BTreeMap<String, Val> = BTreeMap::new();
    let base_prop = g.props.get("baseconfig").and_then(|v| v.first());
    let base_name = match base_prop {
        Some(b) => b.value.clone(),
        None => m.configs.contains_key("default").then(|| "default".to_string()),
    };
    let mut inherit_sources: Vec<Sid> = g.named_by.clone();
    if let Some(b) = base_prop {
        inherit_sources.push(b.sid);
    }
    if let Some(base) = &base_name {
        match m.configs.get(base) {
            Some(cfg) => {
                for (prop, prs) in &cfg.props {
                    let own: Vec<Sid> = prs.iter().map(|pr| pr.sid).collect();
                    let mut sources = own.clone();
                    sources.extend(&inherit_sources);
                    eff.insert(prop.clone(), Val { value: prs[0].value.clone(), own, sources });
                }
            }
            None => {
                if let Some(b) = base_prop {
                    p.not_mapped(b.sid, format!("there is no config {base:?} in this file"));
                }
            }
        }
    }
    for (prop, prs) in &g.props {
        if prop == "baseconfig" {
            continue;
        }
        let own: Vec<Sid> = prs.iter().map(|pr| pr.sid).collect();
        let sources = own.clone();
        eff.insert(prop.clone(), Val { value: prs[0].value.clone(), own, sources });
    }
    eff
}

/// Why a config's settings may end up unused.
fn config_reasons(p: &mut Plan, module: &str, m: &Module) {
    for (name, cfg) in &m.configs {
        let users: Vec<&String> = m
            .instances
            .iter()
            .filter(|(_, g)| match g.props.get("baseconfig").and_then(|v| v.first()) {
                Some(b) => b.value.as_deref() == Some(name.as_str()),
                None => name == "default",
            })
            .map(|(n, _)| n)
            .collect();
        for (prop, prs) in &cfg.props {
            let reason = if users.is_empty() {
                format!(
                    "no instance in this file uses config {name:?}; resilience4j applies it to instances created \
                     at run time by name, and Levee has no template for dependencies not named here: declare \
                     them (resilience4j.{module}.instances.NAME.baseConfig: {name}) to import it"
                )
            } else if users.iter().all(|u| m.instances[*u].props.contains_key(prop)) {
                format!("overridden by every instance that uses config {name:?}")
            } else {
                continue;
            };
            for pr in prs {
                p.not_mapped(pr.sid, reason.clone());
            }
        }
    }
}

fn take<'a>(
    eff: &'a BTreeMap<String, Val>,
    handled: &mut Vec<String>,
    keys: &[&'static str],
) -> Option<(&'static str, &'a Val)> {
    for k in keys {
        if let Some(v) = eff.get(*k) {
            handled.push(k.to_string());
            return Some((k, v));
        }
    }
    None
}

fn reason_for(
    p: &mut Plan,
    eff: &BTreeMap<String, Val>,
    handled: &mut Vec<String>,
    keys: &[&str],
    reason: &str,
) {
    for k in keys {
        if let Some(v) = eff.get(*k) {
            handled.push(k.to_string());
            not_mapped(p, v, reason);
        }
    }
}

fn dur(p: &mut Plan, v: &Val) -> Option<Duration> {
    let text = v.value.as_deref()?;
    match spring_duration(text) {
        Ok(d) => Some(d),
        Err(e) => {
            not_mapped(p, v, &e);
            None
        }
    }
}

fn num(p: &mut Plan, v: &Val) -> Option<f64> {
    let text = v.value.as_deref()?;
    match text.trim().parse::<f64>() {
        Ok(n) if n.is_finite() => Some(n),
        _ => {
            not_mapped(p, v, &format!("{text:?} is not a number"));
            None
        }
    }
}

fn int(p: &mut Plan, v: &Val) -> Option<u32> {
    let n = num(p, v)?;
    if n.fract() != 0.0 || !(0.0..=f64::from(u32::MAX)).contains(&n) {
        not_mapped(p, v, &format!("{} is not a whole number of calls", fmt_num(n)));
        return None;
    }
    Some(n as u32)
}

fn boolean(p: &mut Plan, v: &Val) -> Option<bool> {
    let text = v.value.as_deref()?;
    // Spring's string-to-boolean conversion.
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "on" | "yes" | "1" => Some(true),
        "false" | "off" | "no" | "0" => Some(false),
        _ => {
            not_mapped(p, v, &format!("{text:?} is not true or false"));
            None
        }
    }
}

fn percent_ratio(p: &mut Plan, v: &Val) -> Option<f64> {
    let n = num(p, v)?;
    for &s in &v.own {
        p.note(s, format!("resilience4j percent {} is Levee ratio {}", fmt_num(n), fmt_num(n / 100.0)));
    }
    Some(n / 100.0)
}

fn with(a: &[Sid], b: Option<&Val>) -> Vec<Sid> {
    let mut out = a.to_vec();
    if let Some(v) = b {
        out.extend(&v.sources);
    }
    out
}

fn breaker(p: &mut Plan, dep: &str, eff: &BTreeMap<String, Val>) -> Vec<String> {
    let mut h = Vec::new();
    let size_v = take(eff, &mut h, &["slidingwindowsize", "ringbuffersizeinclosedstate"]);
    if let Some(("ringbuffersizeinclosedstate", v)) = size_v {
        for &s in &v.own {
            p.note(s, "legacy name of slidingWindowSize");
        }
    }
    let type_v = take(eff, &mut h, &["slidingwindowtype"]).map(|x| x.1);
    let time_based = match type_v.and_then(|v| v.value.as_deref()) {
        Some(t) if t.eq_ignore_ascii_case("TIME_BASED") => true,
        Some(t) if t.eq_ignore_ascii_case("COUNT_BASED") => false,
        Some(t) => {
            let reason = format!("{t:?} is neither COUNT_BASED nor TIME_BASED");
            if let Some(v) = type_v {
                not_mapped(p, v, &reason);
            }
            false
        }
        None => false,
    };
    let size = match size_v {
        Some((_, v)) => int(p, v),
        None => Some(100),
    };
    let Some(size) = size else { return h };
    let window = if time_based { Window::Time { seconds: size } } else { Window::Count { size } };
    if size_v.is_some() || type_v.is_some() {
        let shown = if time_based {
            format!("{{type: time, seconds: {size}}}")
        } else {
            format!("{{type: count, size: {size}}}")
        };
        let src = with(&size_v.map(|x| x.1.sources.clone()).unwrap_or_default(), type_v);
        set(p, dep, "circuit_breaker.window", shown, &src, window, |d: &mut DependencyPolicy, w| {
            d.circuit_breaker.window = w
        });
    }
    let min_v = take(eff, &mut h, &["minimumnumberofcalls"]).map(|x| x.1);
    let min = match min_v {
        Some(v) => int(p, v),
        None => Some(100),
    };
    if let Some(min) = min {
        let effective = if time_based { min } else { min.min(size) };
        let capped = effective != min;
        match min_v {
            Some(v) => {
                let src = if capped { with(&v.sources, size_v.map(|x| x.1)) } else { v.sources.clone() };
                if capped {
                    for &s in &v.own {
                        p.note(
                            s,
                            format!("resilience4j caps minimumNumberOfCalls at slidingWindowSize ({size})"),
                        );
                    }
                }
                set(
                    p,
                    dep,
                    "circuit_breaker.minimum_calls",
                    effective.to_string(),
                    &src,
                    effective,
                    |d: &mut DependencyPolicy, v| d.circuit_breaker.minimum_calls = v,
                );
            }
            None => imply(
                p,
                dep,
                "circuit_breaker.minimum_calls",
                effective.to_string(),
                if capped {
                    format!(
                        "resilience4j's default minimumNumberOfCalls (100), capped at slidingWindowSize ({size})"
                    )
                } else {
                    "resilience4j's default minimumNumberOfCalls".into()
                },
                &[],
                effective,
                |d: &mut DependencyPolicy, v| d.circuit_breaker.minimum_calls = v,
            ),
        }
    }
    if let Some((_, v)) = take(eff, &mut h, &["failureratethreshold"])
        && let Some(r) = percent_ratio(p, v)
    {
        set(
            p,
            dep,
            "circuit_breaker.failure_rate_threshold",
            fmt_num(r),
            &v.sources,
            r,
            |d: &mut DependencyPolicy, r| d.circuit_breaker.failure_rate_threshold = r,
        );
    }
    let slow_rate = take(eff, &mut h, &["slowcallratethreshold"]).map(|x| x.1);
    if let Some(v) = slow_rate
        && let Some(r) = percent_ratio(p, v)
    {
        set(
            p,
            dep,
            "circuit_breaker.slow_call_rate_threshold",
            fmt_num(r),
            &v.sources,
            r,
            |d: &mut DependencyPolicy, r| d.circuit_breaker.slow_call_rate_threshold = r,
        );
    }
    match take(eff, &mut h, &["slowcalldurationthreshold"]) {
        Some((_, v)) => {
            if let Some(d) = dur(p, v) {
                set(
                    p,
                    dep,
                    "circuit_breaker.slow_call_duration",
                    fmt_duration(d),
                    &v.sources,
                    Some(d),
                    |x: &mut DependencyPolicy, d| x.circuit_breaker.slow_call_duration = d,
                );
            }
        }
        None if slow_rate.is_some() => imply(
            p,
            dep,
            "circuit_breaker.slow_call_duration",
            "1m",
            "resilience4j's default slowCallDurationThreshold (60s), needed by slowCallRateThreshold",
            &[],
            Some(Duration::from_secs(60)),
            |x: &mut DependencyPolicy, d| x.circuit_breaker.slow_call_duration = d,
        ),
        None => {}
    }
    let wait_v = take(eff, &mut h, &["waitdurationinopenstate"]).map(|x| x.1);
    let wait = match wait_v {
        Some(v) => dur(p, v),
        None => {
            let w = Duration::from_secs(60);
            imply(
                p,
                dep,
                "circuit_breaker.wait_in_open",
                "1m",
                "resilience4j's default waitDurationInOpenState",
                &[],
                w,
                |d: &mut DependencyPolicy, w| d.circuit_breaker.wait_in_open = w,
            );
            Some(w)
        }
    };
    if let (Some(v), Some(w)) = (wait_v, wait) {
        set_duration(p, dep, "circuit_breaker.wait_in_open", &v.sources, w, |d, w| {
            d.circuit_breaker.wait_in_open = w
        });
    }
    let exp_v = take(eff, &mut h, &["enableexponentialbackoff"]).map(|x| x.1);
    let exp = exp_v.and_then(|v| boolean(p, v)).unwrap_or(false);
    let mult_v = take(eff, &mut h, &["exponentialbackoffmultiplier"]).map(|x| x.1);
    let max_v = take(eff, &mut h, &["exponentialmaxwaitdurationinopenstate"]).map(|x| x.1);
    if exp {
        let exp_v = exp_v.unwrap_or_else(|| unreachable!("exp is only true when the setting exists"));
        let mult = mult_v.and_then(|v| num(p, v)).unwrap_or(1.5);
        if mult != 2.0 {
            let why = format!(
                "Levee doubles the open period on each consecutive open; resilience4j multiplies it by {}",
                fmt_num(mult)
            );
            match mult_v {
                Some(v) => not_mapped(p, v, &why),
                None => {
                    for &s in &exp_v.own {
                        p.note(s, format!("{why} (its default)"));
                    }
                }
            }
        }
        let exp_src = if mult == 2.0 { with(&exp_v.sources, mult_v) } else { exp_v.sources.clone() };
        match max_v.and_then(|v| dur(p, v).map(|d| (v, d))) {
            Some((v, d)) => set_duration(
                p,
                dep,
                "circuit_breaker.max_wait_in_open",
                &with(&exp_src, Some(v)),
                d,
                |x, d| x.circuit_breaker.max_wait_in_open = d,
            ),
            None => {
                for &s in &exp_v.own {
                    p.note(s, "resilience4j sets no cap on the growing open period; Levee needs one: its default (5m) is kept");
                }
                let cap = levee_agent::policy::defaults::BREAKER_MAX_WAIT_IN_OPEN;
                set_duration(p, dep, "circuit_breaker.max_wait_in_open", &exp_src, cap, |x, d| {
                    x.circuit_breaker.max_wait_in_open = d
                });
            }
        }
    } else {
        if let Some(v) = mult_v {
            not_mapped(p, v, "exponential backoff is off (enableExponentialBackoff is not true)");
        }
        if let Some(v) = max_v {
            not_mapped(p, v, "exponential backoff is off (enableExponentialBackoff is not true)");
        }
        if let Some(w) = wait {
            let why = "resilience4j keeps the open period constant unless enableExponentialBackoff is true, so \
                       Levee's growth is capped at the wait itself";
            match wait_v {
                Some(v) => {
                    for &s in &v.own {
                        p.note(s, why);
                    }
                    set_duration(
                        p,
                        dep,
                        "circuit_breaker.max_wait_in_open",
                        &with(&v.sources, exp_v),
                        w,
                        |x, d| x.circuit_breaker.max_wait_in_open = d,
                    );
                }
                None => imply(
                    p,
                    dep,
                    "circuit_breaker.max_wait_in_open",
                    fmt_duration(w),
                    why,
                    &[],
                    w,
                    |x: &mut DependencyPolicy, d| x.circuit_breaker.max_wait_in_open = d,
                ),
            }
        }
    }
    reason_for(
        p,
        eff,
        &mut h,
        &["enablerandomizedwait", "randomizedwaitfactor"],
        "Levee's open period has no random factor",
    );
    match take(eff, &mut h, &["permittednumberofcallsinhalfopenstate", "ringbuffersizeinhalfopenstate"]) {
        Some((k, v)) => {
            if k == "ringbuffersizeinhalfopenstate" {
                for &s in &v.own {
                    p.note(s, "legacy name of permittedNumberOfCallsInHalfOpenState");
                }
            }
            if let Some(n) = int(p, v) {
                set(
                    p,
                    dep,
                    "circuit_breaker.half_open_probes",
                    n.to_string(),
                    &v.sources,
                    n,
                    |d: &mut DependencyPolicy, n| d.circuit_breaker.half_open_probes = n,
                );
            }
        }
        None => imply(
            p,
            dep,
            "circuit_breaker.half_open_probes",
            "10",
            "resilience4j's default permittedNumberOfCallsInHalfOpenState",
            &[],
            10u32,
            |d: &mut DependencyPolicy, n| d.circuit_breaker.half_open_probes = n,
        ),
    }
    if let Some((_, v)) = take(eff, &mut h, &["maxwaitdurationinhalfopenstate"])
        && let Some(d) = dur(p, v)
    {
        if d.is_zero() {
            not_mapped(
                p,
                v,
                "0 means resilience4j waits in HALF_OPEN for ever; Levee never waits for ever (default: twice \
                 the attempt timeout)",
            );
        } else {
            set(
                p,
                dep,
                "circuit_breaker.max_wait_in_half_open",
                fmt_duration(d),
                &v.sources,
                Some(d),
                |x: &mut DependencyPolicy, d| x.circuit_breaker.max_wait_in_half_open = d,
            );
        }
    }
    reason_for(
        p,
        eff,
        &mut h,
        &["automatictransitionfromopentohalfopenenabled"],
        "Levee moves to HALF_OPEN on the first call after the open period (no timer thread); callers see the \
         same behaviour",
    );
    reason_for(
        p,
        eff,
        &mut h,
        &[
            "recordexceptions",
            "ignoreexceptions",
            "recordfailurepredicate",
            "ignoreexceptionpredicate",
            "recordresultpredicate",
        ],
        EXCEPTIONS,
    );
    reason_for(p, eff, &mut h, &["registerhealthindicator", "allowhealthindicatortofail"], HEALTH);
    reason_for(p, eff, &mut h, &["eventconsumerbuffersize"], EVENTS);
    reason_for(p, eff, &mut h, &["writablestacktraceenabled"], JAVA);
    h
}

fn retry(p: &mut Plan, dep: &str, eff: &BTreeMap<String, Val>) -> Vec<String> {
    let mut h = Vec::new();
    let attempts_v = take(eff, &mut h, &["maxattempts", "maxretryattempts"]);
    if attempts_v.is_none() {
        // A retry instance without maxAttempts makes resilience4j's default 3 attempts; said
        // explicitly, so the rule for names with no retry instance (one attempt) stays out.
        imply(
            p,
            dep,
            "retry.max_attempts",
            "3",
            "resilience4j's default maxAttempts",
            &[],
            3,
            |d: &mut DependencyPolicy, n| d.retry.max_attempts = n,
        );
    }
    if let Some(("maxretryattempts", v)) = attempts_v {
        for &s in &v.own {
            p.note(s, "legacy name of maxAttempts (attempts in total, the first call included)");
        }
    }
    let attempts = match attempts_v {
        Some((_, v)) => {
            let n = int(p, v);
            if let Some(n) = n {
                set(
                    p,
                    dep,
                    "retry.max_attempts",
                    n.to_string(),
                    &v.sources,
                    n,
                    |d: &mut DependencyPolicy, n| d.retry.max_attempts = n,
                );
            }
            n
        }
        None => Some(3),
    };
    let wait_v = take(eff, &mut h, &["waitduration"]).map(|x| x.1);
    let wait = match wait_v {
        Some(v) => dur(p, v),
        None => Some(Duration::from_millis(500)),
    };
    let jitter = "Levee always uses full jitter: each delay is uniform(0, min(cap, base × 2^n))";
    match (wait_v, wait) {
        (Some(v), Some(w)) => {
            for &s in &v.own {
                p.note(s, jitter);
            }
            set_duration(p, dep, "retry.base", &v.sources, w, |d, w| d.retry.base = w);
        }
        (None, Some(w)) => imply(
            p,
            dep,
            "retry.base",
            fmt_duration(w),
            "resilience4j's default waitDuration",
            &[],
            w,
            |d: &mut DependencyPolicy, w| d.retry.base = w,
        ),
        _ => {}
    }
    let exp_v = take(eff, &mut h, &["enableexponentialbackoff"]).map(|x| x.1);
    let exp = exp_v.and_then(|v| boolean(p, v)).unwrap_or(false);
    let mult_v = take(eff, &mut h, &["exponentialbackoffmultiplier"]).map(|x| x.1);
    let max_v = take(eff, &mut h, &["exponentialmaxwaitduration"]).map(|x| x.1);
    if let Some(w) = wait {
        if exp {
            let mult = mult_v.and_then(|v| num(p, v)).unwrap_or(1.5);
            let max = max_v.and_then(|v| dur(p, v));
            let retries = attempts.unwrap_or(3).saturating_sub(2) as i32;
            let largest = Duration::try_from_secs_f64(w.as_secs_f64() * mult.max(1.0).powi(retries))
                .unwrap_or(Duration::MAX);
            let cap = max.map_or(largest, |m| m.min(largest)).max(w);
            let mut src = with(&exp_v.map(|v| v.sources.clone()).unwrap_or_default(), wait_v);
            src = with(&src, mult_v);
            src = with(&src, max_v);
            src = with(&src, attempts_v.map(|x| x.1));
            let why = if mult == 2.0 {
                "the cap is the largest delay resilience4j would wait: waitDuration × 2^(maxAttempts − 2)"
                    .to_string()
            } else {
                format!(
                    "Levee's delays double (×2) where resilience4j multiplies by {}; the cap is the largest delay \
                     resilience4j would wait: waitDuration × {}^(maxAttempts − 2)",
                    fmt_num(mult),
                    fmt_num(mult)
                )
            };
            for &s in exp_v.map(|v| v.own.as_slice()).unwrap_or_default() {
                p.note(s, why.clone());
            }
            set_duration(p, dep, "retry.cap", &src, cap, |d, c| d.retry.cap = c);
        } else {
            for v in [mult_v, max_v].into_iter().flatten() {
                not_mapped(p, v, "exponential backoff is off (enableExponentialBackoff is not true)");
            }
            let why = "resilience4j waits the same waitDuration before every retry: the cap is that wait";
            match wait_v {
                Some(v) => {
                    set_duration(p, dep, "retry.cap", &with(&v.sources, exp_v), w, |d, c| d.retry.cap = c)
                }
                None => {
                    imply(p, dep, "retry.cap", fmt_duration(w), why, &[], w, |d: &mut DependencyPolicy, c| {
                        d.retry.cap = c
                    })
                }
            }
        }
    }
    reason_for(
        p,
        eff,
        &mut h,
        &["enablerandomizedwait", "randomizedwaitfactor"],
        "Levee always uses full jitter (each delay uniform from 0); there is no randomization factor to set",
    );
    let retry_on = format!("{LEVEE_RETRY_ON}. {EXCEPTIONS}");
    reason_for(
        p,
        eff,
        &mut h,
        &[
            "retryexceptions",
            "ignoreexceptions",
            "retryexceptionpredicate",
            "resultpredicate",
            "retryonresultpredicate",
        ],
        &retry_on,
    );
    reason_for(
        p,
        eff,
        &mut h,
        &["failaftermaxattempts"],
        "Levee returns the last error when the attempts are used up; there is no switch",
    );
    reason_for(p, eff, &mut h, &["eventconsumerbuffersize"], EVENTS);
    reason_for(p, eff, &mut h, &["writablestacktraceenabled"], JAVA);
    h
}

fn bulkhead(p: &mut Plan, dep: &str, eff: &BTreeMap<String, Val>) -> Vec<String> {
    let mut h = Vec::new();
    if let Some((_, v)) = take(eff, &mut h, &["maxconcurrentcalls"])
        && let Some(n) = int(p, v)
    {
        set(
            p,
            dep,
            "bulkhead.max_concurrent",
            n.to_string(),
            &v.sources,
            n,
            |d: &mut DependencyPolicy, n| d.bulkhead.max_concurrent = n,
        );
    }
    if let Some((_, v)) = take(eff, &mut h, &["maxwaitduration"])
        && let Some(d) = dur(p, v)
    {
        set_duration(p, dep, "bulkhead.max_wait", &v.sources, d, |x, d| x.bulkhead.max_wait = d);
    }
    reason_for(p, eff, &mut h, &["faircallhandlingenabled"], "Levee's bulkhead has no fairness switch");
    reason_for(p, eff, &mut h, &["eventconsumerbuffersize"], EVENTS);
    reason_for(p, eff, &mut h, &["writablestacktraceenabled"], JAVA);
    h
}

fn thread_pool(p: &mut Plan, dep: &str, eff: &BTreeMap<String, Val>, has_semaphore: bool) -> Vec<String> {
    let mut h: Vec<String> = Vec::new();
    if has_semaphore {
        let why = "a semaphore bulkhead of the same name is imported; a call uses one of the two (@Bulkhead type), \
                   and Levee has one bulkhead per dependency";
        for (k, v) in eff {
            h.push(k.clone());
            not_mapped(p, v, why);
        }
        return h;
    }
    if let Some((_, v)) = take(eff, &mut h, &["maxthreadpoolsize"])
        && let Some(n) = int(p, v)
    {
        for &s in &v.own {
            p.note(
                s,
                "the pool's threads bound concurrent calls: Levee's bulkhead bounds them without threads",
            );
        }
        set(
            p,
            dep,
            "bulkhead.max_concurrent",
            n.to_string(),
            &v.sources,
            n,
            |d: &mut DependencyPolicy, n| d.bulkhead.max_concurrent = n,
        );
    }
    reason_for(
        p,
        eff,
        &mut h,
        &["corethreadpoolsize", "keepaliveduration"],
        "Levee's bulkhead has no thread pool to size",
    );
    reason_for(
        p,
        eff,
        &mut h,
        &["queuecapacity"],
        "Levee's bulkhead has no queue of its own: a call waits at most max_wait for a slot",
    );
    reason_for(p, eff, &mut h, &["contextpropagators", "writablestacktraceenabled"], JAVA);
    reason_for(p, eff, &mut h, &["eventconsumerbuffersize"], EVENTS);
    h
}

fn time_limiter(p: &mut Plan, dep: &str, eff: &BTreeMap<String, Val>) -> Vec<String> {
    let mut h = Vec::new();
    if let Some((_, v)) = take(eff, &mut h, &["timeoutduration"])
        && let Some(d) = dur(p, v)
    {
        for &s in &v.own {
            p.note(
                s,
                "resilience4j's Spring aspects run the time limiter inside the retry: it limits one attempt",
            );
        }
        set_duration(p, dep, "attempt_timeout", &v.sources, d, |x, d| x.attempt_timeout = d);
    }
    reason_for(
        p,
        eff,
        &mut h,
        &["cancelrunningfuture"],
        "Levee always cancels an attempt at its timeout (the attempt's future is dropped)",
    );
    reason_for(p, eff, &mut h, &["eventconsumerbuffersize"], EVENTS);
    h
}
