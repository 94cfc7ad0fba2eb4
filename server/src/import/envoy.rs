//! Envoy v3: clusters (`circuit_breakers`, `outlier_detection`, `connect_timeout`), routes
//! (`timeout`, `retry_policy`, at route or virtual-host level) and the HTTP fault filter,
//! wherever they appear: a bootstrap (`static_resources`), xDS resources with `@type`, or
//! resources inside a wrapper such as Cilium's `CiliumClusterwideEnvoyConfig`.
//!
//! Each cluster becomes a dependency. A route's settings apply to the clusters it sends to.
//! Envoy's defaults that differ from Levee's are applied where the file relies on them:
//! route timeout 15 s, no retry without a `retry_policy` (one retry with one), retry
//! back-off 25 ms × 10, `max_requests` 1024, outlier detection 5 errors / 10 s / 30 s / 10 %.

use std::collections::BTreeMap;
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
use super::units::{fmt_duration, fmt_num, go_duration};
use super::{ImportError, Source};
use crate::manifest::ServiceManifest;

pub fn import(
    file: &str,
    text: &str,
    base: ServiceManifest,
) -> Result<(ServiceManifest, Report), ImportError> {
    let mut p = Plan::new(Source::Envoy, file);
    let docs = read(text)?;
    doc::register(&mut p, &docs);
    let mut found = Found::default();
    for (i, d) in docs.iter().enumerate() {
        walk(d, At::root(i), None, &mut found);
    }
    // Route configurations first: the fault filters need to know where their routes go.
    let mut clusters_of_rc: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut clusters_at: Vec<(String, Vec<String>)> = Vec::new();
    let mut first = FirstRoute::default();
    for (at, rc) in &found.route_configs {
        let deps = route_config(&mut p, at, rc, &mut first);
        if let Some(name) = rc.get("name").and_then(Node::as_str) {
            clusters_of_rc.entry(name.to_string()).or_default().extend(deps.iter().cloned());
        }
        clusters_at.push((at.text(), deps));
    }
    for (at, c) in &found.clusters {
        cluster(&mut p, at, c);
    }
    for (at, hcm) in &found.hcms {
        let mut deps: Vec<String> = Vec::new();
        let inline = at.key("route_config").text();
        for (rc_at, d) in &clusters_at {
            if *rc_at == inline {
                deps.extend(d.iter().cloned());
            }
        }
        if let Some(name) = hcm.get("rds").and_then(|r| r.get("route_config_name")).and_then(Node::as_str) {
            deps.extend(clusters_of_rc.get(name).cloned().unwrap_or_default());
        }
        deps.sort();
        deps.dedup();
        connection_manager(&mut p, at, hcm, &deps);
    }
    for (i, d) in docs.iter().enumerate() {
        if d.get("overload_manager").is_some() {
            not_mapped_below(
                &mut p,
                &At::root(i).key("overload_manager"),
                "Envoy's overload manager acts on the proxy's memory; Levee's inbound admission limits \
                 concurrency (policy.inbound.limit) and sheds by criticality",
            );
        }
    }
    p.finish(base, &fallback)
}

/// YAML documents, or JSON (read as YAML).
fn read(text: &str) -> Result<Vec<Node>, ImportError> {
    doc::parse_yaml(text)
}

fn fallback(path: &str) -> String {
    if path.contains("match") || path.contains("rewrite") || path.contains("domains") {
        "request matching and rewriting: Levee's settings apply to a whole dependency (or to an operation \
         named by its route template)"
            .into()
    } else {
        "not a timeout, retry, circuit-breaking, outlier-detection or fault setting (listeners, addresses, TLS, \
         protocol options, discovery, load balancing)"
            .into()
    }
}

#[derive(Default)]
struct Found<'a> {
    clusters: Vec<(At, &'a Node)>,
    route_configs: Vec<(At, &'a Node)>,
    hcms: Vec<(At, &'a Node)>,
}

fn is_type(n: &Node, suffix: &str) -> bool {
    n.get("@type").and_then(Node::as_str).is_some_and(|t| t.ends_with(suffix))
}

fn walk<'a>(n: &'a Node, at: At, parent_key: Option<&str>, found: &mut Found<'a>) {
    match n {
        Node::Map(entries) => {
            if n.get("virtual_hosts").is_some() {
                found.route_configs.push((at, n));
                return;
            }
            let cluster_like = [
                "connect_timeout",
                "lb_policy",
                "type",
                "load_assignment",
                "circuit_breakers",
                "outlier_detection",
                "eds_cluster_config",
                "edsClusterConfig",
            ]
            .iter()
            .any(|k| n.get(k).is_some());
            if is_type(n, "cluster.v3.Cluster")
                || (parent_key == Some("clusters") && n.get("name").is_some() && cluster_like)
            {
                found.clusters.push((at, n));
                return;
            }
            if n.get("http_filters").is_some() {
                found.hcms.push((at.clone(), n));
            }
            for (k, v) in entries {
                walk(v, at.key(k), Some(k), found);
            }
        }
        Node::Seq(items) => {
            for (i, v) in items.iter().enumerate() {
                walk(v, at.index(i), parent_key, found);
            }
        }
        _ => {}
    }
}

fn duration_at(p: &mut Plan, at: &At, n: &Node) -> Option<(Duration, Sid)> {
    let sid = at.sid(p)?;
    let text = n.as_str().map(str::to_string).unwrap_or_else(|| n.text());
    match go_duration(&text) {
        Ok(d) => Some((d, sid)),
        Err(e) => {
            p.not_mapped(sid, e);
            None
        }
    }
}

/// Reads the route configuration and maps its routes' settings onto the clusters they send
/// to. Returns those dependencies.
fn route_config(p: &mut Plan, at: &At, rc: &Node, first: &mut FirstRoute) -> Vec<String> {
    let mut deps = Vec::new();
    for (vi, vh) in rc.get("virtual_hosts").map(Node::items).unwrap_or_default().iter().enumerate() {
        let vh_at = at.key("virtual_hosts").index(vi);
        let vh_retry = vh.get("retry_policy").map(|r| (vh_at.key("retry_policy"), r));
        for (ri, r) in vh.get("routes").map(Node::items).unwrap_or_default().iter().enumerate() {
            let r_at = vh_at.key("routes").index(ri);
            let Some(route) = r.get("route") else {
                not_mapped_below(
                    p,
                    &r_at,
                    "a route without an upstream cluster (direct response or redirect): nothing to map",
                );
                continue;
            };
            let ra = r_at.key("route");
            let mut targets: Vec<(String, Option<Sid>)> = Vec::new();
            if let Some(c) = route.get("cluster").and_then(Node::as_str) {
                targets.push((c.to_string(), ra.key("cluster").sid(p)));
            }
            for (ci, wc) in route
                .get("weighted_clusters")
                .and_then(|w| w.get("clusters"))
                .map(Node::items)
                .unwrap_or_default()
                .iter()
                .enumerate()
            {
                let wa = ra.key("weighted_clusters").key("clusters").index(ci);
                if let Some(c) = wc.get("name").and_then(Node::as_str) {
                    targets.push((c.to_string(), wa.key("name").sid(p)));
                }
                if let Some(s) = wa.key("weight").sid(p) {
                    p.not_mapped(s, "traffic split between clusters: Levee does no routing");
                }
            }
            if let Some(s) = ra.key("cluster_header").sid(p) {
                p.not_mapped(s, "cluster chosen from a header at run time: no dependency to name");
            }
            if let Some(s) = ra.key("idle_timeout").sid(p) {
                p.not_mapped(
                    s,
                    "idle timeout of the stream: Levee bounds attempts (attempt_timeout), not idle time",
                );
            }
            let retry = route.get("retry_policy").map(|r| (ra.key("retry_policy"), r)).or(vh_retry.clone());
            for (name, name_sid) in targets {
                let dep = p.dep_name(&name);
                if !deps.contains(&dep) {
                    deps.push(dep.clone());
                }
                let base: Vec<Sid> = name_sid.into_iter().collect();
                route_settings(p, &dep, &r_at, route, retry.as_ref(), &base, first);
            }
        }
    }
    deps
}

/// Maps one route's timeout and retry settings onto dependency `dep` (the first route to
/// send to it wins: [`FirstRoute`]).
fn route_settings(
    p: &mut Plan,
    dep: &str,
    r_at: &At,
    route: &Node,
    retry: Option<&(At, &Node)>,
    base: &[Sid],
    first: &mut FirstRoute,
) {
    let ra = r_at.key("route");
    if let Some((ra_retry, r)) = retry {
        retry_not_mapped(p, ra_retry, r);
    }
    let timeout = route.get("timeout").and_then(|t| duration_at(p, &ra.key("timeout"), t));
    let per_try = retry.and_then(|(a, r)| {
        r.get("per_try_timeout").and_then(|t| duration_at(p, &a.key("per_try_timeout"), t))
    });
    let no_retry = Source::Envoy.attempts_without_retry();
    let attempts = match retry.map(|(_, r)| r.get("num_retries")) {
        None => no_retry.0,
        Some(None) => 2,
        Some(Some(n)) => retry_attempts(n).unwrap_or(no_retry.0),
    };
    let back_off = retry.map(|(a, r)| {
        let b = r.get("retry_back_off");
        let at = a.key("retry_back_off");
        let base_iv =
            b.and_then(|b| b.get("base_interval")).and_then(|t| duration_at(p, &at.key("base_interval"), t));
        let max_iv =
            b.and_then(|b| b.get("max_interval")).and_then(|t| duration_at(p, &at.key("max_interval"), t));
        (base_iv, max_iv)
    });
    let base_d = back_off.and_then(|b| b.0).map_or(Duration::from_millis(25), |(d, _)| d);
    let cap_d = back_off.and_then(|b| b.1).map_or(base_d.saturating_mul(10), |(d, _)| d);
    let t = Timeouts {
        source: "Envoy",
        per_try,
        total: timeout,
        default_total: Some(Duration::from_secs(15)),
        attempts,
    };
    let summary = route_summary(t.attempt_timeout(), attempts, retry.map(|_| (base_d, cap_d)));
    let route_name = r_at.text();
    if let Err(why) = first.claim(p, dep, &route_name, summary) {
        for &s in base {
            p.not_mapped(s, format!("{}: {why}", destination_reason(dep)));
        }
        not_mapped_below(p, &ra.key("timeout"), &why);
        if let Some((ra_retry, _)) = retry {
            for k in ["num_retries", "per_try_timeout", "retry_back_off"] {
                not_mapped_below(p, &ra_retry.key(k), &why);
            }
        }
        return;
    }
    for &s in base {
        p.not_mapped(s, destination_reason(dep));
    }
    let src = |s: Sid| {
        let mut v = base.to_vec();
        v.push(s);
        v
    };
    route_timeout(p, dep, base, &t);
    let (Some((ra_retry, r)), Some((base_iv, max_iv))) = (retry, back_off) else {
        imply(
            p,
            dep,
            "retry.max_attempts",
            no_retry.0.to_string(),
            no_retry.1,
            base,
            no_retry.0,
            |x: &mut DependencyPolicy, n| x.retry.max_attempts = n,
        );
        return;
    };
    match r.get("num_retries") {
        Some(n) => {
            if let Some(s) = ra_retry.key("num_retries").sid(p) {
                set_retries(p, dep, n, s, base);
            }
        }
        None => imply(
            p,
            dep,
            "retry.max_attempts",
            "2",
            "Envoy's default num_retries (1) when a retry_policy is set",
            base,
            2u32,
            |x: &mut DependencyPolicy, n| x.retry.max_attempts = n,
        ),
    }
    match base_iv {
        Some((d, s)) => {
            p.note(s, "Envoy's back-off is fully jittered exponential, as Levee's");
            set_duration(p, dep, "retry.base", &src(s), d, |x, d| x.retry.base = d);
        }
        None => imply(
            p,
            dep,
            "retry.base",
            fmt_duration(base_d),
            "Envoy's default retry back-off base_interval",
            base,
            base_d,
            |x: &mut DependencyPolicy, d| x.retry.base = d,
        ),
    }
    match max_iv {
        Some((d, s)) => set_duration(p, dep, "retry.cap", &src(s), d, |x, d| x.retry.cap = d),
        None => imply(
            p,
            dep,
            "retry.cap",
            fmt_duration(cap_d),
            "Envoy's default max_interval (10 × base_interval)",
            base,
            cap_d,
            |x: &mut DependencyPolicy, d| x.retry.cap = d,
        ),
    }
}

/// The settings of a retry policy Levee has no field for, with their reasons.
fn retry_not_mapped(p: &mut Plan, ra_retry: &At, r: &Node) {
    if let Some(s) = ra_retry.key("retry_on").sid(p) {
        let list = r.get("retry_on").map(Node::text).unwrap_or_default();
        p.not_mapped(s, retry_on_reason(&list));
    }
    for k in ["host_selection_retry_max_attempts", "retry_host_predicate", "retry_priority"] {
        not_mapped_below(
            p,
            &ra_retry.key(k),
            "host selection on retry: Levee's outlier detection keeps ejected endpoints out; there is no \
             per-retry host rule",
        );
    }
    for k in ["retriable_status_codes", "retriable_headers", "retriable_request_headers"] {
        not_mapped_below(
            p,
            &ra_retry.key(k),
            &retry_on_reason(k.trim_end_matches('s').replace('_', "-").as_str()),
        );
    }
    not_mapped_below(
        p,
        &ra_retry.key("rate_limited_retry_back_off"),
        "Levee honours a server's Retry-After when it fits the deadline; there is nothing to configure",
    );
}

fn cluster(p: &mut Plan, at: &At, c: &Node) {
    let Some(name) = c.get("name").and_then(Node::as_str) else {
        not_mapped_below(p, at, "a cluster without a name: no dependency to attach it to");
        return;
    };
    let dep = p.dep_name(name);
    let name_sid: Vec<Sid> = at.key("name").sid(p).into_iter().collect();
    if let Some(s) = at.key("connect_timeout").sid(p) {
        p.not_mapped(s, CONNECT);
    }
    let mut max_requests_set = false;
    for (ti, t) in c
        .get("circuit_breakers")
        .and_then(|cb| cb.get("thresholds"))
        .map(Node::items)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let ta = at.key("circuit_breakers").key("thresholds").index(ti);
        let priority = t.get("priority").and_then(Node::as_str).unwrap_or("DEFAULT");
        if priority != "DEFAULT" {
            not_mapped_below(
                p,
                &ta,
                "thresholds of HIGH-priority requests: Levee's outgoing calls have no priority",
            );
            continue;
        }
        let mut sel: Vec<Sid> = ta.key("priority").sid(p).into_iter().collect();
        sel.extend(&name_sid);
        let with = |s: Sid| {
            let mut v = sel.clone();
            v.push(s);
            v
        };
        if let (Some(n), Some(s)) = (t.get("max_requests"), ta.key("max_requests").sid(p)) {
            match whole(n).and_then(|v| u32::try_from(v).ok()) {
                Some(v) => {
                    p.note(s, "Envoy's max_requests bounds the requests in flight to the cluster, as Levee's bulkhead does");
                    set(
                        p,
                        &dep,
                        "bulkhead.max_concurrent",
                        v.to_string(),
                        &with(s),
                        v,
                        |x: &mut DependencyPolicy, v| x.bulkhead.max_concurrent = v,
                    );
                    max_requests_set = true;
                }
                None => p.not_mapped(s, "not a whole number of requests"),
            }
        }
        if let Some(s) = ta.key("max_pending_requests").sid(p) {
            p.not_mapped(s, QUEUE);
        }
        for k in ["max_connections", "max_connection_pools"] {
            if let Some(s) = ta.key(k).sid(p) {
                p.not_mapped(s, CONNECTIONS);
            }
        }
        if let Some(s) = ta.key("max_retries").sid(p) {
            p.not_mapped(s, CONCURRENT_RETRIES);
        }
        if let Some(rb) = t.get("retry_budget") {
            let rba = ta.key("retry_budget");
            let pct_at = rba.key("budget_percent").key("value");
            if let (Some(s), Some(v)) =
                (pct_at.sid(p), rb.get("budget_percent").and_then(|b| b.get("value")).and_then(Node::as_f64))
            {
                let ratio = v / 100.0;
                p.note(
                    s,
                    format!(
                        "approximate: Envoy lets retries be {}% of the requests in flight; Levee deposits {} retry \
                         token per success",
                        fmt_num(v),
                        fmt_num(ratio)
                    ),
                );
                set(
                    p,
                    &dep,
                    "retry.budget.ratio",
                    fmt_num(ratio),
                    &with(s),
                    ratio,
                    |x: &mut DependencyPolicy, r| x.retry.budget.ratio = r,
                );
            }
            not_mapped_below(
                p,
                &rba.key("min_retry_concurrency"),
                "a floor of concurrent retries: Levee's floor is retry.budget.min_retries_per_sec (per second)",
            );
        }
        not_mapped_below(p, &ta.key("track_remaining"), "statistics switch: nothing to set in Levee");
    }
    if !max_requests_set {
        imply(
            p,
            &dep,
            "bulkhead.max_concurrent",
            "1024",
            "Envoy's default circuit_breakers max_requests",
            &name_sid,
            1024u32,
            |x: &mut DependencyPolicy, v| x.bulkhead.max_concurrent = v,
        );
    }
    if let Some(od) = c.get("outlier_detection") {
        outlier(p, &dep, &at.key("outlier_detection"), od, &name_sid);
    }
    not_mapped_below(
        p,
        &at.key("health_checks"),
        "active health checking: Levee has none; its outlier detection is passive (it watches real calls)",
    );
    not_mapped_below(p, &at.key("common_lb_config").key("healthy_panic_threshold"), PANIC);
}

fn outlier(p: &mut Plan, dep: &str, at: &At, od: &Node, name_sid: &[Sid]) {
    let envoy = mesh_outlier_defaults();
    let mut trigger = name_sid.to_vec();
    trigger.extend(at.sid(p));
    if error_count(&[("consecutive_5xx", od.get("consecutive_5xx"))]) == ErrorCount::Off {
        // 0 consecutive 5xx never ejects, and no other count of Envoy's is imported.
        if let Some(s) = at.key("consecutive_5xx").sid(p) {
            p.note(s, zero_count_reason("consecutive_5xx", None));
            set(p, dep, "outlier_detection", "null", &[s], (), |x: &mut DependencyPolicy, ()| {
                x.outlier_detection = None
            });
        }
        let off = "outlier detection is off (consecutive_5xx is 0): nothing to tune";
        for k in ["interval", "base_ejection_time", "max_ejection_percent", "enforcing_consecutive_5xx"] {
            not_mapped_below(p, &at.key(k), off);
        }
    } else {
        imply(
            p,
            dep,
            "outlier_detection",
            "{consecutive_errors: 5, interval: 10s, base_ejection_time: 30s, max_ejection_percent: 10}",
            "outlier_detection is present: Envoy's defaults for the fields it does not set",
            &trigger,
            Some(envoy),
            |x: &mut DependencyPolicy, o| x.outlier_detection = o,
        );
        let src = |s: Sid| {
            let mut v = name_sid.to_vec();
            v.push(s);
            v
        };
        if let (Some(n), Some(s)) = (od.get("consecutive_5xx"), at.key("consecutive_5xx").sid(p)) {
            match whole(n).and_then(|v| u32::try_from(v).ok()) {
                Some(v) => set(
                    p,
                    dep,
                    "outlier_detection.consecutive_errors",
                    v.to_string(),
                    &src(s),
                    v,
                    |x: &mut DependencyPolicy, v| {
                        x.outlier_detection.get_or_insert_with(OutlierDetection::default).consecutive_errors =
                            v
                    },
                ),
                None => p.not_mapped(s, "not a whole number of errors"),
            }
        }
        for (key, field) in [
            ("interval", "outlier_detection.interval"),
            ("base_ejection_time", "outlier_detection.base_ejection_time"),
        ] {
            if let Some((d, s)) = od.get(key).and_then(|n| duration_at(p, &at.key(key), n)) {
                let apply: fn(&mut DependencyPolicy, Duration) = if key == "interval" {
                    |x, d| x.outlier_detection.get_or_insert_with(OutlierDetection::default).interval = d
                } else {
                    |x, d| {
                        x.outlier_detection.get_or_insert_with(OutlierDetection::default).base_ejection_time =
                            d
                    }
                };
                set_duration(p, dep, field, &src(s), d, apply);
            }
        }
        if let (Some(n), Some(s)) = (od.get("max_ejection_percent"), at.key("max_ejection_percent").sid(p)) {
            match whole(n).and_then(|v| u32::try_from(v).ok()) {
                Some(v) => set(
                    p,
                    dep,
                    "outlier_detection.max_ejection_percent",
                    v.to_string(),
                    &src(s),
                    v,
                    |x: &mut DependencyPolicy, v| {
                        x.outlier_detection
                            .get_or_insert_with(OutlierDetection::default)
                            .max_ejection_percent = v
                    },
                ),
                None => p.not_mapped(s, "not a whole percentage"),
            }
        }
        if let Some(s) = at.key("enforcing_consecutive_5xx").sid(p) {
            if od.get("enforcing_consecutive_5xx").and_then(Node::as_f64) == Some(100.0) {
                p.not_mapped(s, "Levee always enforces its ejections, as 100 does");
            } else {
                p.not_mapped(
                    s,
                    "Levee always enforces an ejection; a percentage below 100 has no equivalent",
                );
            }
        }
    }
    for k in [
        "split_external_local_origin_errors",
        "consecutive_local_origin_failure",
        "enforcing_consecutive_local_origin_failure",
        "enforcing_local_origin_success_rate",
        "failure_percentage_threshold_local_origin",
    ] {
        not_mapped_below(p, &at.key(k), UNSPLIT);
    }
    for k in ["consecutive_gateway_failure", "enforcing_consecutive_gateway_failure"] {
        not_mapped_below(p, &at.key(k), ONE_COUNT);
    }
    for k in [
        "success_rate_minimum_hosts",
        "success_rate_request_volume",
        "success_rate_stdev_factor",
        "enforcing_success_rate",
        "failure_percentage_threshold",
        "enforcing_failure_percentage",
        "failure_percentage_minimum_hosts",
        "failure_percentage_request_volume",
    ] {
        not_mapped_below(
            p,
            &at.key(k),
            "Levee's outlier detection counts consecutive errors only (no success-rate or failure-percentage ejection)",
        );
    }
    for k in ["max_ejection_time", "max_ejection_time_jitter"] {
        not_mapped_below(
            p,
            &at.key(k),
            "Levee's ejection time is base_ejection_time × times ejected, with no cap to set",
        );
    }
}

fn connection_manager(p: &mut Plan, at: &At, hcm: &Node, deps: &[String]) {
    if let Some(s) = at.key("request_timeout").sid(p) {
        p.not_mapped(
            s,
            "timeout of the whole downstream request at the proxy: Levee's inbound budget is policy.default_deadline \
             / policy.max_deadline, propagated with each request; set it by hand if this is the service's budget",
        );
    }
    for k in ["stream_idle_timeout", "request_headers_timeout", "drain_timeout", "delayed_close_timeout"] {
        not_mapped_below(
            p,
            &at.key(k),
            "a connection or stream timer of the proxy: Levee bounds calls, not connections",
        );
    }
    not_mapped_below(
        p,
        &at.key("common_http_protocol_options").key("idle_timeout"),
        "a connection or stream timer of the proxy: Levee bounds calls, not connections",
    );
    for (fi, f) in hcm.get("http_filters").map(Node::items).unwrap_or_default().iter().enumerate() {
        let fa = at.key("http_filters").index(fi);
        let name = f.get("name").and_then(Node::as_str).unwrap_or_default();
        let Some(cfg) = f.get("typed_config") else { continue };
        if !(name.ends_with(".fault") || is_type(cfg, "HTTPFault")) {
            continue;
        }
        let ca = fa.key("typed_config");
        let mut filter_reason = String::new();
        for kind in ["abort", "delay"] {
            let Some(k) = cfg.get(kind) else { continue };
            let ka = ca.key(kind);
            let pct = fractional_percent(k.get("percentage"));
            let action = if kind == "abort" {
                match (k.get("http_status"), k.get("grpc_status")) {
                    (Some(s), _) => format!("abort with HTTP {}", s.text()),
                    (None, Some(g)) => format!("abort with gRPC status {}", g.text()),
                    (None, None) => "abort with the status from a request header".to_string(),
                }
            } else {
                match k.get("fixed_delay").map(|d| d.text()) {
                    Some(d) => format!("delay of {}", go_duration(&d).map(fmt_duration).unwrap_or(d)),
                    None => "delay from a request header".to_string(),
                }
            };
            let mut reason = fault_reason(&action, pct, deps);
            if pct == 0.0 {
                reason.push_str(". At 0% it is off unless runtime keys (fault.http.*) switch it on");
            }
            not_mapped_below(p, &ka, &reason);
            filter_reason = reason;
        }
        if filter_reason.is_empty() {
            filter_reason = "fault filter: fault injection is not part of a Levee manifest".into();
        }
        not_mapped_below(p, &fa, &filter_reason);
    }
}

/// Envoy's `FractionalPercent` as a percentage: `numerator` over `HUNDRED` (default),
/// `TEN_THOUSAND` or `MILLION`.
pub fn fractional_percent(n: Option<&Node>) -> f64 {
    let Some(n) = n else { return 0.0 };
    let numerator = n.get("numerator").and_then(Node::as_f64).unwrap_or(0.0);
    let per_percent = match n.get("denominator").and_then(Node::as_str).unwrap_or("HUNDRED") {
        "TEN_THOUSAND" => 100.0,
        "MILLION" => 10_000.0,
        _ => 1.0,
    };
    numerator / per_percent
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(y: &str) -> Node {
        doc::parse_yaml(y).unwrap().remove(0)
    }

    #[test]
    fn fractional_percent_scales_by_denominator() {
        assert_eq!(fractional_percent(Some(&node("{numerator: 5}"))), 5.0);
        assert_eq!(fractional_percent(Some(&node("{numerator: 5, denominator: HUNDRED}"))), 5.0);
        assert_eq!(fractional_percent(Some(&node("{numerator: 250, denominator: TEN_THOUSAND}"))), 2.5);
        assert_eq!(fractional_percent(Some(&node("{numerator: 1500, denominator: MILLION}"))), 0.15);
        assert_eq!(fractional_percent(None), 0.0);
    }
}
