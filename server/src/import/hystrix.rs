//! Hystrix (with the Ribbon and Zuul settings that sit beside it) from Spring Cloud
//! Netflix YAML or Archaius `.properties`.
//!
//! Dependencies are the named Hystrix commands (`hystrix.command.<name>`), Ribbon clients
//! (`<name>.ribbon.*`) and Zuul routes' `serviceId`s (Zuul names both its Hystrix command
//! and its Ribbon client after the service). `hystrix.command.default`,
//! `hystrix.threadpool.default` and the global `ribbon.*` apply to every such name; with no
//! name in the file they have nothing to apply to and are reported so. Every Hystrix
//! command has a circuit breaker: Hystrix's defaults (10 s window, 20 requests, 50 %, 5 s
//! sleep, one trial call) apply where the file sets nothing. Times are milliseconds.
//! Hystrix's timeout and Ribbon's `ReadTimeout` both bound an attempt: the smaller wins.

use std::collections::BTreeMap;
use std::time::Duration;

use levee_agent::policy::{DependencyPolicy, Window};

use super::common::{CONNECT, EXCEPTIONS, imply, set, set_duration};
use super::plan::{Plan, Sid};
use super::report::Report;
use super::spring::{self, Prop, canon};
use super::units::{fmt_duration, fmt_num};
use super::{ImportError, Source};
use crate::manifest::ServiceManifest;

/// A setting value after `default` / global inheritance.
#[derive(Clone, Debug)]
struct Val {
    value: Option<String>,
    own: Vec<Sid>,
}

#[derive(Default, Debug)]
struct Scoped {
    /// Relaxed property path (`execution.isolation.thread.timeoutinmilliseconds`) → props.
    default: BTreeMap<String, Vec<Prop>>,
    named: BTreeMap<String, BTreeMap<String, Vec<Prop>>>,
}

impl Scoped {
    fn effective(&self, name: &str) -> BTreeMap<String, Val> {
        let mut out = BTreeMap::new();
        for (k, prs) in self.default.iter().chain(self.named.get(name).into_iter().flatten()) {
            out.insert(
                k.clone(),
                Val { value: prs[0].value.clone(), own: prs.iter().map(|p| p.sid).collect() },
            );
        }
        out
    }
}

pub fn import(
    file: &str,
    text: &str,
    base: ServiceManifest,
) -> Result<(ServiceManifest, Report), ImportError> {
    let mut p = Plan::new(Source::Hystrix, file);
    let props = spring::read(&mut p, text)?;
    let mut commands = Scoped::default();
    let mut pools = Scoped::default();
    let mut ribbon = Scoped::default();
    let mut zuul_services: Vec<(String, Sid)> = Vec::new();
    for pr in &props {
        let c0 = pr.canon(0);
        if spring::application_name(&mut p, pr) {
            continue;
        }
        if c0 == "hystrix" && pr.keys.len() >= 4 && (pr.canon(1) == "command" || pr.canon(1) == "threadpool")
        {
            let scoped = if pr.canon(1) == "command" { &mut commands } else { &mut pools };
            let prop = pr.canon_from(3);
            if pr.keys[2] == "default" {
                scoped.default.entry(prop).or_default().push(pr.clone());
            } else {
                scoped.named.entry(pr.keys[2].clone()).or_default().entry(prop).or_default().push(pr.clone());
            }
        } else if c0 == "hystrix" {
            p.not_mapped(pr.sid, "a Hystrix setting outside command and threadpool (collapser, metrics, plugins): no Levee equivalent");
        } else if c0 == "ribbon" && pr.keys.len() >= 2 {
            ribbon.default.entry(pr.canon_from(1)).or_default().push(pr.clone());
        } else if pr.keys.len() >= 3 && pr.canon(1) == "ribbon" {
            ribbon
                .named
                .entry(pr.keys[0].clone())
                .or_default()
                .entry(pr.canon_from(2))
                .or_default()
                .push(pr.clone());
        } else if c0 == "zuul" && pr.keys.len() == 4 && pr.canon(1) == "routes" && pr.canon(3) == "serviceid"
        {
            if let Some(v) = &pr.value {
                zuul_services.push((v.clone(), pr.sid));
            }
        } else if pr.canon_from(0) == "feign.hystrix.enabled" {
            p.not_mapped(
                pr.sid,
                "switches Feign's Hystrix wrapping on; in Levee the agent wraps the calls (levee-agent)",
            );
        }
    }
    let mut command_names: BTreeMap<String, Vec<Sid>> = BTreeMap::new();
    let mut client_names: BTreeMap<String, Vec<Sid>> = BTreeMap::new();
    for n in commands.named.keys() {
        command_names.entry(n.clone()).or_default();
    }
    for n in ribbon.named.keys() {
        client_names.entry(n.clone()).or_default();
    }
    for (svc, sid) in &zuul_services {
        p.note(*sid, "Zuul names the route's Hystrix command and Ribbon client after its serviceId");
        command_names.entry(svc.clone()).or_default().push(*sid);
        client_names.entry(svc.clone()).or_default().push(*sid);
    }
    for n in pools.named.keys() {
        if !command_names.contains_key(n) {
            for pr in pools.named[n].values().flatten() {
                p.not_mapped(
                    pr.sid,
                    format!("no Hystrix command named {n:?} in this file to attach the thread pool to"),
                );
            }
        }
    }
    let none_named = |what: &str| {
        format!(
            "{what} applies to every name, and this file names none: Levee has no template for dependencies not \
             named here (set the value per dependency)"
        )
    };
    if command_names.is_empty() {
        for pr in commands.default.values().chain(pools.default.values()).flatten() {
            p.not_mapped(pr.sid, none_named("hystrix.command.default / hystrix.threadpool.default"));
        }
    }
    if client_names.is_empty() {
        for pr in ribbon.default.values().flatten() {
            p.not_mapped(pr.sid, none_named("the global ribbon.* setting"));
        }
    }
    for (scope, names, what) in [
        (&commands, &command_names, "hystrix.command.NAME"),
        (&pools, &command_names, "hystrix.threadpool.NAME"),
        (&ribbon, &client_names, "NAME.ribbon"),
    ] {
        if names.is_empty() {
            continue;
        }
        for (k, prs) in &scope.default {
            if names.keys().all(|n| scope.named.get(n).is_some_and(|m| m.contains_key(k))) {
                for pr in prs {
                    p.not_mapped(pr.sid, format!("overridden for every name in this file ({what})"));
                }
            }
        }
    }
    let mut names: Vec<&String> = command_names.keys().chain(client_names.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let dep = p.dep_name(name);
        let cmd =
            command_names.get(name).map(|via| (commands.effective(name), pools.effective(name), via.clone()));
        let rib = client_names.get(name).map(|via| (ribbon.effective(name), via.clone()));
        timeouts(
            &mut p,
            &dep,
            cmd.as_ref().map(|c| (&c.0, c.2.as_slice())),
            rib.as_ref().map(|r| (&r.0, r.1.as_slice())),
        );
        if let Some((c, pool, via)) = &cmd {
            command(&mut p, &dep, c, pool, via);
        }
        if let Some((r, via)) = &rib {
            ribbon_retries(&mut p, &dep, r, via);
        }
    }
    p.finish(base, &|path| {
        let c = canon(path);
        if c.starts_with("zuul.") {
            "a Zuul gateway setting (routes, host timeouts for url routes, headers): not a Hystrix setting"
                .into()
        } else if c.contains("ribbon.") {
            "a Ribbon load-balancer or client setting (server list, HTTP client): not a resilience policy"
                .into()
        } else {
            "not a Hystrix setting".into()
        }
    })
}

fn get<'a>(m: &'a BTreeMap<String, Val>, k: &str) -> Option<&'a Val> {
    m.get(k)
}

fn millis(p: &mut Plan, v: &Val) -> Option<Duration> {
    let text = v.value.as_deref()?.trim().to_string();
    match text.parse::<u64>() {
        Ok(ms) => Some(Duration::from_millis(ms)),
        Err(_) => {
            for &s in &v.own {
                p.not_mapped(s, format!("{text:?} is not a whole number of milliseconds"));
            }
            None
        }
    }
}

fn whole(p: &mut Plan, v: &Val) -> Option<u32> {
    let text = v.value.as_deref()?.trim().to_string();
    match text.parse::<u32>() {
        Ok(n) => Some(n),
        Err(_) => {
            for &s in &v.own {
                p.not_mapped(s, format!("{text:?} is not a whole number"));
            }
            None
        }
    }
}

fn src(v: &Val, via: &[Sid]) -> Vec<Sid> {
    let mut out = v.own.clone();
    out.extend(via);
    out
}

fn reason(p: &mut Plan, v: Option<&Val>, why: &str) {
    for &s in v.map(|v| v.own.as_slice()).unwrap_or_default() {
        p.not_mapped(s, why);
    }
}

/// Hystrix's timeout (the whole command) and Ribbon's ReadTimeout (one attempt): Levee's
/// attempt timeout is the smaller one.
fn timeouts(
    p: &mut Plan,
    dep: &str,
    cmd: Option<(&BTreeMap<String, Val>, &[Sid])>,
    rib: Option<(&BTreeMap<String, Val>, &[Sid])>,
) {
    let h = cmd.and_then(|(c, via)| {
        get(c, "execution.isolation.thread.timeoutinmilliseconds").map(|v| (v.clone(), via))
    });
    let r = rib.and_then(|(c, via)| get(c, "readtimeout").map(|v| (v.clone(), via)));
    if let Some((c, _)) = rib {
        reason(p, get(c, "connecttimeout"), CONNECT);
    }
    if let Some((c, _)) = cmd {
        if let Some(v) = get(c, "execution.timeout.enabled")
            && v.value.as_deref() == Some("false")
        {
            reason(p, Some(v), "Levee's timeouts are always finite");
        } else {
            reason(p, get(c, "execution.timeout.enabled"), "Levee's timeouts are always on");
        }
    }
    let hd = h.as_ref().and_then(|(v, _)| millis(p, v));
    let rd = r.as_ref().and_then(|(v, _)| millis(p, v));
    let smaller_note =
        "Hystrix's timeout and Ribbon's ReadTimeout both bound the call; the smaller one governs";
    match (h.as_ref().zip(hd), r.as_ref().zip(rd)) {
        (Some(((hv, hvia), hd)), Some(((rv, rvia), rd))) => {
            let (win, win_via, win_d, lose) =
                if hd <= rd { (hv, hvia, hd, (rv, rd)) } else { (rv, rvia, rd, (hv, hd)) };
            let mut s = src(win, win_via);
            if hd == rd {
                s.extend(src(lose.0, &[]));
            } else {
                reason(
                    p,
                    Some(lose.0),
                    &format!(
                        "{smaller_note}: {} is smaller than {}",
                        fmt_duration(win_d),
                        fmt_duration(lose.1)
                    ),
                );
            }
            for &x in &s {
                p.note(x, smaller_note);
            }
            set_duration(p, dep, "attempt_timeout", &s, win_d, |x, d| x.attempt_timeout = d);
        }
        (Some(((v, via), d)), None) | (None, Some(((v, via), d))) => {
            set_duration(p, dep, "attempt_timeout", &src(v, via), d, |x, d| x.attempt_timeout = d);
        }
        (None, None) => {
            if let Some((_, via)) = cmd {
                imply(
                    p,
                    dep,
                    "attempt_timeout",
                    "1s",
                    "Hystrix's default timeoutInMilliseconds (1000)",
                    via,
                    Duration::from_secs(1),
                    |x: &mut DependencyPolicy, d| x.attempt_timeout = d,
                );
            }
        }
    }
}

fn command(p: &mut Plan, dep: &str, c: &BTreeMap<String, Val>, pool: &BTreeMap<String, Val>, via: &[Sid]) {
    let mut handled: Vec<&str> =
        vec!["execution.isolation.thread.timeoutinmilliseconds", "execution.timeout.enabled"];
    let mut take = |k: &'static str| {
        handled.push(k);
        get(c, k)
    };
    if let Some(v) = take("circuitbreaker.enabled")
        && let Some(b) = v.value.as_deref().map(|t| t.trim().eq_ignore_ascii_case("true"))
    {
        set(
            p,
            dep,
            "circuit_breaker.enabled",
            b.to_string(),
            &src(v, via),
            b,
            |x: &mut DependencyPolicy, b| x.circuit_breaker.enabled = b,
        );
    }
    match take("circuitbreaker.requestvolumethreshold") {
        Some(v) => {
            if let Some(n) = whole(p, v) {
                set(
                    p,
                    dep,
                    "circuit_breaker.minimum_calls",
                    n.to_string(),
                    &src(v, via),
                    n,
                    |x: &mut DependencyPolicy, n| x.circuit_breaker.minimum_calls = n,
                );
            }
        }
        None => imply(
            p,
            dep,
            "circuit_breaker.minimum_calls",
            "20",
            "Hystrix's default requestVolumeThreshold",
            via,
            20u32,
            |x: &mut DependencyPolicy, n| x.circuit_breaker.minimum_calls = n,
        ),
    }
    if let Some(v) = take("circuitbreaker.errorthresholdpercentage")
        && let Some(n) = whole(p, v)
    {
        let r = f64::from(n) / 100.0;
        for &s in &v.own {
            p.note(s, format!("Hystrix percent {n} is Levee ratio {}", fmt_num(r)));
        }
        set(
            p,
            dep,
            "circuit_breaker.failure_rate_threshold",
            fmt_num(r),
            &src(v, via),
            r,
            |x: &mut DependencyPolicy, r| x.circuit_breaker.failure_rate_threshold = r,
        );
    }
    let sleep = match take("circuitbreaker.sleepwindowinmilliseconds") {
        Some(v) => millis(p, v).map(|d| (d, src(v, via))),
        None => {
            let d = Duration::from_secs(5);
            imply(
                p,
                dep,
                "circuit_breaker.wait_in_open",
                "5s",
                "Hystrix's default sleepWindowInMilliseconds",
                via,
                d,
                |x: &mut DependencyPolicy, d| x.circuit_breaker.wait_in_open = d,
            );
            imply(
                p,
                dep,
                "circuit_breaker.max_wait_in_open",
                "5s",
                "Hystrix keeps the sleep window constant",
                via,
                d,
                |x: &mut DependencyPolicy, d| x.circuit_breaker.max_wait_in_open = d,
            );
            None
        }
    };
    if let Some((d, s)) = sleep {
        set_duration(p, dep, "circuit_breaker.wait_in_open", &s, d, |x, d| {
            x.circuit_breaker.wait_in_open = d
        });
        set_duration(p, dep, "circuit_breaker.max_wait_in_open", &s, d, |x, d| {
            x.circuit_breaker.max_wait_in_open = d
        });
    }
    match take("metrics.rollingstats.timeinmilliseconds") {
        Some(v) => {
            if let Some(d) = millis(p, v) {
                if d.as_millis() % 1000 == 0 && d.as_secs() >= 1 && d.as_secs() <= u64::from(u32::MAX) {
                    let secs = d.as_secs() as u32;
                    set(
                        p,
                        dep,
                        "circuit_breaker.window",
                        format!("{{type: time, seconds: {secs}}}"),
                        &src(v, via),
                        Window::Time { seconds: secs },
                        |x: &mut DependencyPolicy, w| x.circuit_breaker.window = w,
                    );
                } else {
                    reason(p, Some(v), "Levee's time window counts whole seconds");
                }
            }
        }
        None => imply(
            p,
            dep,
            "circuit_breaker.window",
            "{type: time, seconds: 10}",
            "Hystrix's default rolling window (metrics.rollingStats.timeInMilliseconds 10000)",
            via,
            Window::Time { seconds: 10 },
            |x: &mut DependencyPolicy, w| x.circuit_breaker.window = w,
        ),
    }
    imply(
        p,
        dep,
        "circuit_breaker.half_open_probes",
        "1",
        "Hystrix lets one trial request through after the sleep window",
        via,
        1u32,
        |x: &mut DependencyPolicy, n| x.circuit_breaker.half_open_probes = n,
    );
    for k in ["circuitbreaker.forceopen", "circuitbreaker.forceclosed"] {
        let v = take(k);
        reason(
            p,
            v,
            "an operator's override, not a policy: in Levee it is a breaker override (forced_open / forced_closed) \
             set through the API or the UI, with a reason and an expiry",
        );
    }
    let semaphore = take("execution.isolation.strategy").map(|v| {
        let sem = v.value.as_deref().is_some_and(|t| t.trim().eq_ignore_ascii_case("SEMAPHORE"));
        (v.clone(), sem)
    });
    let is_sem = semaphore.as_ref().is_some_and(|(_, s)| *s);
    let sem_max = take("execution.isolation.semaphore.maxconcurrentrequests");
    if is_sem {
        let (strategy, _) = semaphore.clone().unwrap_or_else(|| unreachable!("is_sem implies a strategy"));
        match sem_max {
            Some(v) => {
                if let Some(n) = whole(p, v) {
                    let mut s = src(v, via);
                    s.extend(&strategy.own);
                    set(
                        p,
                        dep,
                        "bulkhead.max_concurrent",
                        n.to_string(),
                        &s,
                        n,
                        |x: &mut DependencyPolicy, n| x.bulkhead.max_concurrent = n,
                    );
                }
            }
            None => imply(
                p,
                dep,
                "bulkhead.max_concurrent",
                "10",
                "Hystrix's default semaphore maxConcurrentRequests",
                &strategy.own,
                10u32,
                |x: &mut DependencyPolicy, n| x.bulkhead.max_concurrent = n,
            ),
        }
        for v in pool.values() {
            reason(p, Some(v), "the command uses semaphore isolation: its thread pool is not used");
        }
    } else {
        reason(p, sem_max, "the command uses thread isolation: the semaphore limit is not used");
        if let Some((v, _)) = &semaphore {
            reason(p, Some(v), "thread isolation (the default): its thread pool size becomes the bulkhead");
        }
        match get(pool, "coresize") {
            Some(v) => {
                if let Some(n) = whole(p, v) {
                    for &s in &v.own {
                        p.note(s, "the pool's threads bound concurrent calls: Levee's bulkhead bounds them without threads");
                    }
                    set(
                        p,
                        dep,
                        "bulkhead.max_concurrent",
                        n.to_string(),
                        &src(v, via),
                        n,
                        |x: &mut DependencyPolicy, n| x.bulkhead.max_concurrent = n,
                    );
                }
            }
            None => imply(
                p,
                dep,
                "bulkhead.max_concurrent",
                "10",
                "Hystrix's default thread pool coreSize (pools are per command group, shared by its commands)",
                via,
                10u32,
                |x: &mut DependencyPolicy, n| x.bulkhead.max_concurrent = n,
            ),
        }
        for k in ["maxqueuesize", "queuesizerejectionthreshold"] {
            reason(
                p,
                get(pool, k),
                "Levee's bulkhead has no queue of its own: a call waits at most max_wait for a slot",
            );
        }
        for k in ["maximumsize", "allowmaximumsizetodivergefromcoresize", "keepalivetimeminutes"] {
            reason(p, get(pool, k), "Levee's bulkhead has no thread pool to size");
        }
        for (k, v) in pool {
            if ![
                "coresize",
                "maxqueuesize",
                "queuesizerejectionthreshold",
                "maximumsize",
                "allowmaximumsizetodivergefromcoresize",
                "keepalivetimeminutes",
            ]
            .contains(&k.as_str())
            {
                reason(p, Some(v), "thread-pool metrics setting: no Levee equivalent");
            }
        }
    }
    for k in ["execution.isolation.thread.interruptontimeout", "execution.isolation.thread.interruptoncancel"]
    {
        let v = take(k);
        reason(p, v, "Levee always cancels an attempt at its timeout (the attempt's future is dropped)");
    }
    for k in ["fallback.enabled", "fallback.isolation.semaphore.maxconcurrentrequests"] {
        let v = take(k);
        reason(
            p,
            v,
            "Levee's fallback is set per dependency (fallback level, fallback_timeout); it has no concurrency limit or switch",
        );
    }
    for k in ["requestcache.enabled", "requestlog.enabled"] {
        let v = take(k);
        reason(p, v, "request cache and log of Hystrix: no Levee equivalent");
    }
    for (k, v) in c {
        if handled.contains(&k.as_str()) {
            continue;
        }
        if k.starts_with("metrics.") {
            reason(
                p,
                Some(v),
                "Hystrix metrics setting (buckets, percentiles, health snapshots): Levee's time window uses 1 s buckets",
            );
        } else {
            reason(p, Some(v), &format!("{EXCEPTIONS}; or a Hystrix setting with no Levee equivalent"));
        }
    }
}

/// Ribbon retries: `(1 + MaxAutoRetries) × (1 + MaxAutoRetriesNextServer)` attempts, with
/// no back-off.
fn ribbon_retries(p: &mut Plan, dep: &str, r: &BTreeMap<String, Val>, via: &[Sid]) {
    let same = get(r, "maxautoretries");
    let next = get(r, "maxautoretriesnextserver");
    if same.is_some() || next.is_some() {
        let a = same.and_then(|v| whole(p, v)).unwrap_or(0);
        let b = next.and_then(|v| whole(p, v)).unwrap_or(1);
        let attempts = (a.saturating_add(1)).saturating_mul(b.saturating_add(1));
        let mut s: Vec<Sid> = via.to_vec();
        for v in [same, next].into_iter().flatten() {
            s.extend(&v.own);
            p.note(
                v.own[0],
                format!(
                    "Ribbon makes (1 + MaxAutoRetries) × (1 + MaxAutoRetriesNextServer) = {attempts} attempts{}",
                    if next.is_none() { " (MaxAutoRetriesNextServer defaults to 1)" } else { "" }
                ),
            );
        }
        set(
            p,
            dep,
            "retry.max_attempts",
            attempts.to_string(),
            &s,
            attempts,
            |x: &mut DependencyPolicy, n| x.retry.max_attempts = n,
        );
        if attempts > 1 {
            imply(
                p,
                dep,
                "retry.base",
                "1ms",
                "Ribbon retries at once; Levee's smallest back-off (1ms) is used",
                &s,
                Duration::from_millis(1),
                |x: &mut DependencyPolicy, d| x.retry.base = d,
            );
            imply(
                p,
                dep,
                "retry.cap",
                "1ms",
                "Ribbon retries at once",
                &s,
                Duration::from_millis(1),
                |x: &mut DependencyPolicy, d| x.retry.cap = d,
            );
        }
    }
    reason(
        p,
        get(r, "oktoretryonalloperations"),
        "Levee retries only idempotent operations (GET, HEAD, OPTIONS, PUT, DELETE, or marked idempotent: true \
         per operation); there is no switch for all operations",
    );
}
