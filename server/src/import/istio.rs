//! Istio: `VirtualService` (http routes: `timeout`, `retries`, `fault`) and
//! `DestinationRule` (`trafficPolicy.connectionPool` and `outlierDetection`, top level or
//! per subset), in one or more YAML documents (or a `kind: List`).
//!
//! A destination host is a dependency. Durations are Istio's (`1s`, `15.000s`, `3m`);
//! `retries.attempts` counts retries (Levee counts attempts: `attempts + 1`); fault
//! percentages are `percentage.value` (0–100) or the deprecated integer `percent`. A route
//! without `retries` gets Istio's default (2 retries, 25 ms back-off), and
//! `outlierDetection` fills what it leaves out with Istio's defaults (5 errors, 10 s, 30 s,
//! 10 %).

use std::time::Duration;

use levee_agent::policy::{DependencyPolicy, OutlierDetection};

use super::common::{
    At, CONCURRENT_RETRIES, CONNECT, CONNECTIONS, ErrorCount, FirstRoute, ONE_COUNT, PANIC, QUEUE, Timeouts,
    UNSPLIT, destination_reason, error_count, fault_reason, imply, mesh_outlier_defaults, not_mapped_below,
    retry_attempts, retry_on_reason, route_summary, route_timeout, set, set_duration, set_retries, whole,
    zero_count_reason,
};
use super::doc::{self, Node};
use super::plan::{Plan, Sid};
use super::report::Report;
use super::units::{fmt_duration, go_duration};
use super::{ImportError, Source};
use crate::manifest::ServiceManifest;

pub fn import(
    file: &str,
    text: &str,
    base: ServiceManifest,
) -> Result<(ServiceManifest, Report), ImportError> {
    let mut p = Plan::new(Source::Istio, file);
    let docs = doc::parse_yaml(text)?;
    doc::register(&mut p, &docs);
    let mut first = FirstRoute::default();
    for (i, d) in docs.iter().enumerate() {
        resource(&mut p, &At::root(i), d, &mut first);
    }
    p.finish(base, &fallback)
}

fn fallback(path: &str) -> String {
    let last = path.rsplit('.').next().unwrap_or(path);
    if path.starts_with("metadata") || ["apiVersion", "kind"].contains(&last) || path.contains("].metadata") {
        "identifies the resource; not a setting".into()
    } else {
        "routing, matching or traffic shaping (hosts, gateways, match, rewrite, redirect, mirror, headers, load \
         balancing, TLS): Levee applies its settings to a whole dependency"
            .into()
    }
}

fn resource(p: &mut Plan, at: &At, d: &Node, first: &mut FirstRoute) {
    match d.get("kind").and_then(Node::as_str) {
        Some("List") => {
            for (i, item) in d.get("items").map(Node::items).unwrap_or_default().iter().enumerate() {
                resource(p, &at.key("items").index(i), item, first);
            }
        }
        Some("VirtualService") => virtual_service(p, at, d, first),
        Some("DestinationRule") => destination_rule(p, at, d),
        other => not_mapped_below(
            p,
            at,
            &format!(
                "a {} resource: the Istio importer reads VirtualService and DestinationRule",
                other.unwrap_or("kind-less")
            ),
        ),
    }
}

fn duration(p: &mut Plan, at: &At, n: &Node) -> Option<(Duration, Sid)> {
    let sid = at.sid(p)?;
    match go_duration(&n.text()) {
        Ok(d) => Some((d, sid)),
        Err(e) => {
            p.not_mapped(sid, e);
            None
        }
    }
}

fn virtual_service(p: &mut Plan, at: &At, d: &Node, first: &mut FirstRoute) {
    let spec = at.key("spec");
    let Some(http) = d.get("spec").and_then(|s| s.get("http")) else { return };
    for (ri, route) in http.items().iter().enumerate() {
        let ra = spec.key("http").index(ri);
        let mut targets: Vec<(String, Vec<Sid>)> = Vec::new();
        for (di, dest) in route.get("route").map(Node::items).unwrap_or_default().iter().enumerate() {
            let da = ra.key("route").index(di);
            let Some(host) = dest.get("destination").and_then(|x| x.get("host")).and_then(Node::as_str)
            else {
                continue;
            };
            let sid: Vec<Sid> = da.key("destination").key("host").sid(p).into_iter().collect();
            targets.push((host.to_string(), sid));
            not_mapped_below(
                p,
                &da.key("weight"),
                "traffic split between destinations: Levee does no routing",
            );
            not_mapped_below(
                p,
                &da.key("destination").key("subset"),
                "a subset (version) of the destination: Levee configures a dependency as a whole",
            );
            not_mapped_below(
                p,
                &da.key("destination").key("port"),
                "the destination's port: Levee names dependencies, not ports",
            );
        }
        let timeout = route.get("timeout").and_then(|t| duration(p, &ra.key("timeout"), t));
        let retries = route.get("retries");
        let ret_at = ra.key("retries");
        let per_try = retries
            .and_then(|r| r.get("perTryTimeout"))
            .and_then(|t| duration(p, &ret_at.key("perTryTimeout"), t));
        if let Some(s) = ret_at.key("retryOn").sid(p) {
            let list = retries.and_then(|r| r.get("retryOn")).map(Node::text).unwrap_or_default();
            p.not_mapped(s, retry_on_reason(&list));
        }
        not_mapped_below(
            p,
            &ret_at.key("retryRemoteLocalities"),
            "locality-aware retries: Levee does not choose endpoints by locality",
        );
        let deps: Vec<String> = targets.iter().map(|(h, _)| p.dep_name(h)).collect();
        let attempts_at = ret_at.key("attempts");
        let attempts_node = retries.and_then(|r| r.get("attempts"));
        let attempts =
            attempts_node.and_then(retry_attempts).unwrap_or(Source::Istio.attempts_without_retry().0);
        let t = Timeouts { source: "Istio", per_try, total: timeout, default_total: None, attempts };
        let back_off = (Duration::from_millis(25), Duration::from_millis(250));
        let route_name =
            if at.doc > 0 { format!("{} (document {})", ra.text(), at.doc + 1) } else { ra.text() };
        for ((_, host_sid), dep) in targets.iter().zip(&deps) {
            let summary = route_summary(t.attempt_timeout(), attempts, Some(back_off));
            if let Err(why) = first.claim(p, dep, &route_name, summary) {
                for &s in host_sid {
                    p.not_mapped(s, format!("{}: {why}", destination_reason(dep)));
                }
                for a in [ra.key("timeout"), attempts_at.clone(), ret_at.key("perTryTimeout")] {
                    not_mapped_below(p, &a, &why);
                }
                continue;
            }
            for &s in host_sid {
                p.not_mapped(s, destination_reason(dep));
            }
            if !route_timeout(p, dep, host_sid, &t) {
                p.general_note(format!(
                    "{dep}: Istio sets no timeout by default; a Levee attempt timeout is always finite, so Levee's \
                     default (1s) applies"
                ));
            }
            match (attempts_node, attempts_at.sid(p)) {
                (Some(n), Some(s)) => set_retries(p, dep, n, s, host_sid),
                (Some(_), None) => {}
                (None, _) => {
                    let (n, why) = Source::Istio.attempts_without_retry();
                    imply(
                        p,
                        dep,
                        "retry.max_attempts",
                        n.to_string(),
                        why,
                        host_sid,
                        n,
                        |x: &mut DependencyPolicy, n| x.retry.max_attempts = n,
                    )
                }
            }
            imply(
                p,
                dep,
                "retry.base",
                fmt_duration(back_off.0),
                "Istio's (Envoy's) default retry back-off",
                host_sid,
                back_off.0,
                |x: &mut DependencyPolicy, d| x.retry.base = d,
            );
            imply(
                p,
                dep,
                "retry.cap",
                fmt_duration(back_off.1),
                "Istio's (Envoy's) default retry back-off cap",
                host_sid,
                back_off.1,
                |x: &mut DependencyPolicy, d| x.retry.cap = d,
            );
        }
        if let Some(fault) = route.get("fault") {
            vs_fault(p, &ra.key("fault"), fault, &deps);
        }
    }
}

fn vs_fault(p: &mut Plan, at: &At, fault: &Node, deps: &[String]) {
    for kind in ["delay", "abort"] {
        let Some(k) = fault.get(kind) else { continue };
        let ka = at.key(kind);
        let percent = match (
            k.get("percentage").and_then(|x| x.get("value")).and_then(Node::as_f64),
            k.get("percent").and_then(Node::as_f64),
        ) {
            (Some(v), _) => v,
            (None, Some(v)) => {
                if let Some(s) = ka.key("percent").sid(p) {
                    p.note(s, "deprecated integer percent; Istio now uses percentage.value");
                }
                v
            }
            (None, None) => 100.0,
        };
        let action = if kind == "delay" {
            match k.get("fixedDelay").map(Node::text) {
                Some(d) => format!("delay of {}", go_duration(&d).map(fmt_duration).unwrap_or(d)),
                None => "an exponential delay (no Levee equivalent)".to_string(),
            }
        } else {
            match (k.get("httpStatus"), k.get("grpcStatus"), k.get("http2Error")) {
                (Some(s), _, _) => format!("abort with HTTP {}", s.text()),
                (None, Some(g), _) => format!("abort with gRPC status {}", g.text()),
                (None, None, Some(_)) => "a connection error".to_string(),
                _ => "abort".to_string(),
            }
        };
        not_mapped_below(p, &ka, &fault_reason(&action, percent, deps));
    }
}

fn destination_rule(p: &mut Plan, at: &At, d: &Node) {
    let spec = at.key("spec");
    let Some(sp) = d.get("spec") else { return };
    let Some(host) = sp.get("host").and_then(Node::as_str) else {
        not_mapped_below(p, at, "a DestinationRule without a host: no dependency to attach it to");
        return;
    };
    let dep = p.dep_name(host);
    let host_sid: Vec<Sid> = spec.key("host").sid(p).into_iter().collect();
    let top = sp.get("trafficPolicy").map(|tp| vec![(spec.key("trafficPolicy"), tp)]).unwrap_or_default();
    let subsets: Vec<(At, &Node)> = sp
        .get("subsets")
        .map(Node::items)
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            s.get("trafficPolicy").map(|tp| (spec.key("subsets").index(i).key("trafficPolicy"), tp))
        })
        .collect();
    for (i, s) in sp.get("subsets").map(Node::items).unwrap_or_default().iter().enumerate() {
        let sa = spec.key("subsets").index(i);
        for k in ["name", "labels"] {
            if s.get(k).is_some() {
                not_mapped_below(
                    p,
                    &sa.key(k),
                    "defines a subset (a version, by pod labels): Levee configures a dependency as a whole",
                );
            }
        }
    }
    if !top.is_empty() {
        traffic_policy(p, &dep, &top, &host_sid);
    }
    if subsets.is_empty() {
        return;
    }
    let all_subsets = sp.get("subsets").map(Node::items).map_or(0, <[Node]>::len);
    let same = subsets.len() == all_subsets && subsets.windows(2).all(|w| w[0].1 == w[1].1);
    if same && top.is_empty() {
        p.general_note(format!(
            "{host}: every subset has the same trafficPolicy; it is applied to the whole dependency {dep}"
        ));
        traffic_policy(p, &dep, &subsets, &host_sid);
    } else {
        let why = if top.is_empty() {
            "a per-subset (version) policy that differs between subsets: Levee configures a dependency as a whole"
        } else {
            "a per-subset (version) policy: Levee configures a dependency as a whole, from the top-level trafficPolicy"
        };
        for (a, _) in &subsets {
            not_mapped_below(p, a, why);
        }
    }
}

/// Maps one traffic policy, given at one or more places with the same content (the same
/// relative setting at every place is a source of the assignment).
fn traffic_policy(p: &mut Plan, dep: &str, places: &[(At, &Node)], host_sid: &[Sid]) {
    let tp = places[0].1;
    let sids = |p: &Plan, rel: &[&str]| -> Vec<Sid> {
        let mut v = host_sid.to_vec();
        for (a, _) in places {
            let mut x = a.clone();
            for k in rel {
                x = x.key(k);
            }
            v.extend(x.sid(p));
        }
        v
    };
    let below = |p: &mut Plan, rel: &[&str], reason: &str| {
        for (a, _) in places {
            let mut x = a.clone();
            for k in rel {
                x = x.key(k);
            }
            not_mapped_below(p, &x, reason);
        }
    };
    let get = |rel: &[&str]| -> Option<&Node> {
        let mut n = tp;
        for k in rel {
            n = n.get(k)?;
        }
        Some(n)
    };
    if let Some(n) = get(&["connectionPool", "http", "http2MaxRequests"]) {
        let src = sids(p, &["connectionPool", "http", "http2MaxRequests"]);
        match whole(n).and_then(|v| u32::try_from(v).ok()) {
            Some(v) => set(
                p,
                dep,
                "bulkhead.max_concurrent",
                v.to_string(),
                &src,
                v,
                |x: &mut DependencyPolicy, v| x.bulkhead.max_concurrent = v,
            ),
            None => {
                below(p, &["connectionPool", "http", "http2MaxRequests"], "not a whole number of requests")
            }
        }
    }
    below(p, &["connectionPool", "http", "http1MaxPendingRequests"], QUEUE);
    below(p, &["connectionPool", "http", "maxRetries"], CONCURRENT_RETRIES);
    for k in [
        "maxRequestsPerConnection",
        "idleTimeout",
        "h2UpgradePolicy",
        "useClientProtocol",
        "maxConcurrentStreams",
    ] {
        below(p, &["connectionPool", "http", k], "a connection setting: Levee bounds calls, not connections");
    }
    below(p, &["connectionPool", "tcp", "connectTimeout"], CONNECT);
    for k in ["maxConnections", "tcpKeepalive", "maxConnectionDuration", "idleTimeout"] {
        below(p, &["connectionPool", "tcp", k], CONNECTIONS);
    }
    if get(&["connectionPool", "http"]).is_some_and(|n| n.entries().is_empty()) {
        below(p, &["connectionPool", "http"], "empty: nothing to map");
    }
    if get(&["connectionPool", "tcp"]).is_some_and(|n| n.entries().is_empty()) {
        below(p, &["connectionPool", "tcp"], "empty: nothing to map");
    }
    if let Some(od) = get(&["outlierDetection"]) {
        outlier(
            p,
            dep,
            od,
            &|p, k| sids(p, &["outlierDetection", k]),
            &|p, k, r| below(p, &["outlierDetection", k], r),
            host_sid,
        );
    }
    for k in ["loadBalancer", "tls", "portLevelSettings", "tunnel", "proxyProtocol"] {
        below(p, &[k], "load balancing, TLS, per-port or tunnel settings: outside Levee's policy");
    }
}

type Sids<'a> = dyn Fn(&Plan, &str) -> Vec<Sid> + 'a;
type Below<'a> = dyn Fn(&mut Plan, &str, &str) + 'a;

fn outlier(p: &mut Plan, dep: &str, od: &Node, sids: &Sids<'_>, below: &Below<'_>, host_sid: &[Sid]) {
    const COUNTS: [&str; 3] = ["consecutive5xxErrors", "consecutiveGatewayErrors", "consecutiveErrors"];
    let counts: Vec<(&str, Option<&Node>)> = COUNTS.iter().map(|k| (*k, od.get(k))).collect();
    let errors = match error_count(&counts) {
        ErrorCount::From(k) => Some(k),
        ErrorCount::Unset => None,
        ErrorCount::Off => {
            // Every count is 0: Istio ejects nothing, so the manifest has no outlier
            // detection, and the rest of outlierDetection has nothing to tune.
            let mut src: Vec<Sid> = Vec::new();
            for k in COUNTS.into_iter().filter(|k| od.get(k).is_some()) {
                for s in sids(p, k) {
                    if !host_sid.contains(&s) {
                        p.note(s, zero_count_reason(k, None));
                    }
                    if !src.contains(&s) {
                        src.push(s);
                    }
                }
            }
            set(p, dep, "outlier_detection", "null", &src, (), |x: &mut DependencyPolicy, ()| {
                x.outlier_detection = None
            });
            let off = "outlier detection is off (every consecutive-error count is 0): nothing to tune";
            for k in ["interval", "baseEjectionTime", "maxEjectionPercent", "minHealthPercent"] {
                below(p, k, off);
            }
            for k in ["splitExternalLocalOriginErrors", "consecutiveLocalOriginFailures"] {
                below(p, k, UNSPLIT);
            }
            return;
        }
    };
    let istio = mesh_outlier_defaults();
    imply(
        p,
        dep,
        "outlier_detection",
        "{consecutive_errors: 5, interval: 10s, base_ejection_time: 30s, max_ejection_percent: 10}",
        "outlierDetection is present: Istio's defaults for the fields it does not set",
        host_sid,
        Some(istio),
        |x: &mut DependencyPolicy, o| x.outlier_detection = o,
    );
    for k in COUNTS {
        let Some(n) = od.get(k) else { continue };
        let src = sids(p, k);
        if Some(k) != errors {
            if whole(n) == Some(0) {
                below(p, k, &zero_count_reason(k, errors));
            } else {
                below(p, k, ONE_COUNT);
            }
            continue;
        }
        let Some(v) = whole(n).and_then(|v| u32::try_from(v).ok()) else {
            below(p, k, "not a whole number of errors");
            continue;
        };
        let note = match k {
            "consecutiveErrors" => Some(
                "deprecated field; Istio counted only 502/503/504 for it, Levee counts every 5xx and connection failures",
            ),
            "consecutiveGatewayErrors" => {
                Some("Istio counts 502/503/504 here; Levee counts every 5xx and connection failures")
            }
            _ => None,
        };
        if let Some(note) = note {
            for &s in src.iter().filter(|s| !host_sid.contains(s)) {
                p.note(s, note);
            }
        }
        set(
            p,
            dep,
            "outlier_detection.consecutive_errors",
            v.to_string(),
            &src,
            v,
            |x: &mut DependencyPolicy, v| {
                x.outlier_detection.get_or_insert_with(OutlierDetection::default).consecutive_errors = v
            },
        );
    }
    for (k, field) in [
        ("interval", "outlier_detection.interval"),
        ("baseEjectionTime", "outlier_detection.base_ejection_time"),
    ] {
        let Some(n) = od.get(k) else { continue };
        match go_duration(&n.text()) {
            Ok(d) => {
                let apply: fn(&mut DependencyPolicy, Duration) = if k == "interval" {
                    |x, d| x.outlier_detection.get_or_insert_with(OutlierDetection::default).interval = d
                } else {
                    |x, d| {
                        x.outlier_detection.get_or_insert_with(OutlierDetection::default).base_ejection_time =
                            d
                    }
                };
                set_duration(p, dep, field, &sids(p, k), d, apply);
            }
            Err(e) => below(p, k, &e),
        }
    }
    if let Some(n) = od.get("maxEjectionPercent") {
        match whole(n).and_then(|v| u32::try_from(v).ok()) {
            Some(v) => set(
                p,
                dep,
                "outlier_detection.max_ejection_percent",
                v.to_string(),
                &sids(p, "maxEjectionPercent"),
                v,
                |x: &mut DependencyPolicy, v| {
                    x.outlier_detection.get_or_insert_with(OutlierDetection::default).max_ejection_percent = v
                },
            ),
            None => below(p, "maxEjectionPercent", "not a whole percentage"),
        }
    }
    below(p, "minHealthPercent", PANIC);
    for k in ["splitExternalLocalOriginErrors", "consecutiveLocalOriginFailures"] {
        below(p, k, UNSPLIT);
    }
}
