//! Hand-made inputs for what the corpus does not show: values out of Levee's range,
//! conflicts, unit scales, unresolvable placeholders, bad input.

use std::time::Duration;

use levee_server::import::{ImportError, ImportOptions, Imported, Source, import};

use super::{import_text, mapped_to, reason};

#[test]
fn values_outside_levee_range_are_reported_with_the_range_not_clamped() {
    let i = import_text(
        Source::Resilience4j,
        "resilience4j.retry.instances.pricing:\n  maxAttempts: 12\n  waitDuration: 100ms\n\
         resilience4j.circuitbreaker.instances.pricing:\n  failureRateThreshold: 0\n  slidingWindowSize: 20\n",
    );
    i.manifest.validate().unwrap();
    let why = reason(&i, "resilience4j.retry.instances.pricing.maxAttempts");
    assert!(why.contains("max_attempts = 12") && why.contains("must be between 1 and 10"), "{why}");
    let why = reason(&i, "resilience4j.circuitbreaker.instances.pricing.failureRateThreshold");
    assert!(why.contains("must be a ratio, 0 < x <= 1"), "{why}");
    let d = &i.manifest.policy.dependencies["pricing"];
    assert_eq!(d.retry.max_attempts, 3, "Levee's default stays; nothing is clamped to 10");
    assert_eq!(d.retry.base, Duration::from_millis(100));
}

#[test]
fn a_placeholder_without_default_is_not_mapped_and_says_why() {
    let i = import_text(
        Source::Resilience4j,
        "resilience4j.timelimiter.instances.a.timeoutDuration=${TIMEOUT}\n",
    );
    assert!(reason(&i, "resilience4j.timelimiter.instances.a.timeoutDuration").contains("${TIMEOUT}"));
}

#[test]
fn a_duration_spring_does_not_read_is_refused_with_the_accepted_forms() {
    let i = import_text(Source::Resilience4j, "resilience4j.timelimiter.instances.a.timeoutDuration: 1.5s\n");
    let why = reason(&i, "resilience4j.timelimiter.instances.a.timeoutDuration");
    assert!(why.contains("500ms, 5s, 1m") && why.contains("milliseconds"), "{why}");
}

#[test]
fn iso8601_and_kebab_case_are_read() {
    let i = import_text(
        Source::Resilience4j,
        "resilience4j:\n  timelimiter:\n    instances:\n      a:\n        timeout-duration: PT0.25S\n",
    );
    assert_eq!(i.manifest.policy.dependencies["a"].attempt_timeout, Duration::from_millis(250));
}

#[test]
fn names_that_collide_after_conversion_are_told_apart() {
    let i = import_text(
        Source::Resilience4j,
        "resilience4j.bulkhead.instances:\n  backendA: {maxConcurrentCalls: 1}\n  backend-a: {maxConcurrentCalls: 2}\n",
    );
    let deps = &i.manifest.policy.dependencies;
    assert_eq!(deps["backend-a"].bulkhead.max_concurrent, 2);
    assert_eq!(deps["backend-a-2"].bulkhead.max_concurrent, 1);
}

#[test]
fn two_routes_setting_one_cluster_differently_keep_the_first_and_report_the_second() {
    let text = "\
static_resources:
  listeners:
  - filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          route_config:
            virtual_hosts:
            - name: a
              routes:
              - match: {prefix: /a}
                route: {cluster: pricing, timeout: 2s}
              - match: {prefix: /b}
                route: {cluster: pricing, timeout: 5s}
          http_filters:
          - name: envoy.filters.http.fault
            typed_config:
              abort:
                http_status: 503
                percentage: {numerator: 250, denominator: TEN_THOUSAND}
";
    let i = import_text(Source::Envoy, text);
    let base = "static_resources.listeners[0].filter_chains[0].filters[0].typed_config";
    assert_eq!(i.manifest.policy.dependencies["pricing"].attempt_timeout, Duration::from_secs(2));
    let why = reason(&i, &format!("{base}.route_config.virtual_hosts[0].routes[1].route.timeout"));
    assert!(why.contains("conflicts with") && why.contains("attempt_timeout = 2s"), "{why}");
    let why = reason(&i, &format!("{base}.http_filters[0].typed_config.abort.percentage.numerator"));
    assert!(why.contains("on 2.5 percent"), "TEN_THOUSAND scales 250 to 2.5%: {why}");
}

#[test]
fn istio_percentage_value_is_a_percent_and_subsets_that_differ_are_not_merged() {
    let text = "\
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: r}
spec:
  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews}
    fault:
      delay: {fixedDelay: 1.5s, percentage: {value: 0.5}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: r}
spec:
  host: reviews
  subsets:
  - name: v1
    trafficPolicy: {connectionPool: {http: {http2MaxRequests: 10}}}
  - name: v2
    trafficPolicy: {connectionPool: {http: {http2MaxRequests: 20}}}
";
    let i = import_text(Source::Istio, text);
    assert!(
        reason(&i, "spec.http[0].fault.delay.percentage.value").contains("delay of 1s 500ms on 0.5 percent")
    );
    assert!(
        reason(&i, "spec.subsets[1].trafficPolicy.connectionPool.http.http2MaxRequests").contains("differs")
    );
    assert_eq!(
        i.manifest.policy.dependencies["reviews"].bulkhead.max_concurrent, 25,
        "Levee's default stays"
    );
}

#[test]
fn sentinel_thread_flow_rule_is_a_bulkhead_and_odd_windows_are_reported() {
    let text = r#"[
      {"resource": "db", "grade": 0, "count": 12, "strategy": 0, "limitApp": "default", "controlBehavior": 0},
      {"resource": "db", "grade": 1, "count": 0.5, "timeWindow": 5, "statIntervalMs": 1500, "minRequestAmount": 10}
    ]"#;
    let i = import_text(Source::Sentinel, text);
    let d = &i.manifest.policy.dependencies["db"];
    assert_eq!(d.bulkhead.max_concurrent, 12);
    assert_eq!(d.circuit_breaker.failure_rate_threshold, 0.5);
    assert_eq!(d.circuit_breaker.minimum_calls, 10);
    assert!(reason(&i, "[1].statIntervalMs").contains("whole seconds"));
    assert_eq!(mapped_to(&i, "[0].count"), ["policy.dependencies.db.bulkhead.max_concurrent = 12"]);
}

#[test]
fn hystrix_semaphore_isolation_and_breaker_settings() {
    let text = "\
hystrix.command.pricing.execution.isolation.strategy=SEMAPHORE
hystrix.command.pricing.execution.isolation.semaphore.maxConcurrentRequests=7
hystrix.command.pricing.circuitBreaker.errorThresholdPercentage=25
hystrix.command.pricing.circuitBreaker.sleepWindowInMilliseconds=2000
hystrix.command.pricing.circuitBreaker.requestVolumeThreshold=30
hystrix.command.pricing.metrics.rollingStats.timeInMilliseconds=20000
hystrix.command.pricing.circuitBreaker.forceOpen=false
";
    let i = import_text(Source::Hystrix, text);
    let d = &i.manifest.policy.dependencies["pricing"];
    assert_eq!(d.bulkhead.max_concurrent, 7);
    assert_eq!(d.circuit_breaker.failure_rate_threshold, 0.25);
    assert_eq!(
        (d.circuit_breaker.wait_in_open, d.circuit_breaker.max_wait_in_open),
        (Duration::from_secs(2), Duration::from_secs(2))
    );
    assert_eq!(d.circuit_breaker.minimum_calls, 30);
    assert_eq!(d.circuit_breaker.window, levee_agent::policy::Window::Time { seconds: 20 });
    assert_eq!(d.circuit_breaker.half_open_probes, 1);
    assert!(reason(&i, "hystrix.command.pricing.circuitBreaker.forceOpen").contains("breaker override"));
}

#[test]
fn bad_input_is_an_error_that_says_what_is_wrong() {
    let opts = ImportOptions::default();
    let e = import(Source::Istio, "x.yaml", "kind: [unclosed\n", &opts).unwrap_err();
    assert!(matches!(e, ImportError::Syntax { format: "YAML", .. }), "{e}");
    let e = import(Source::Sentinel, "x.json", "{\"resource\": \"a\"}", &opts).unwrap_err();
    assert!(e.to_string().contains("JSON array of rules"), "{e}");
    let e = import(Source::Sentinel, "x.json", "[{\"resource\": ", &opts).unwrap_err();
    assert!(matches!(e, ImportError::Syntax { format: "JSON", .. }), "{e}");
    let bad = ImportOptions { environment: "prod".into(), service: Some("Bad Name".into()) };
    let e = import(Source::Sentinel, "x.json", "[]", &bad).unwrap_err();
    assert!(e.to_string().contains("service"), "{e}");
}

#[test]
fn the_service_name_comes_from_spring_or_the_file_name() {
    let opts = ImportOptions::default();
    let i =
        import(Source::Resilience4j, "conf/application.yml", "spring.application.name: Pricing_API\n", &opts)
            .unwrap();
    assert_eq!((i.manifest.environment.as_str(), i.manifest.service.as_str()), ("default", "pricing-api"));
    let i = import(Source::Sentinel, "rules/DegradeRule.json", "[]", &opts).unwrap();
    assert_eq!(i.manifest.service, "degrade-rule");
}

#[test]
fn no_importer_panics_on_truncated_or_foreign_files() {
    let sources = [Source::Resilience4j, Source::Envoy, Source::Istio, Source::Sentinel, Source::Hystrix];
    let opts = ImportOptions::default();
    for kind in std::fs::read_dir(super::corpus_dir()).unwrap() {
        let kind = kind.unwrap().path();
        if !kind.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&kind).unwrap() {
            let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
            // Every importer on every file (most are foreign to it), then the file cut short
            // at many places: an error or a report, never a panic, and a valid manifest.
            for source in sources {
                if let Ok(i) = import(source, "f", &text, &opts) {
                    i.manifest.validate().unwrap();
                }
            }
            let cuts: Vec<usize> =
                (0..text.len()).step_by(53).filter(|&c| text.is_char_boundary(c)).collect();
            for cut in cuts {
                for source in sources {
                    if let Ok(i) = import(source, "f", &text[..cut], &opts) {
                        i.manifest.validate().unwrap();
                    }
                }
            }
        }
    }
}

/// A name with no retry in the source keeps one attempt: Levee's default of 3 would add
/// retries the source never made.
#[test]
fn a_dependency_without_retry_in_the_source_keeps_the_sources_attempts() {
    let attempts = |i: &Imported, dep: &str| i.manifest.policy.dependencies[dep].retry.max_attempts;
    let noted = |i: &Imported, dep: &str| {
        i.report
            .notes
            .iter()
            .any(|n| n.starts_with(&format!("policy.dependencies.{dep}.retry.max_attempts = ")))
    };
    // resilience4j: a breaker only → one attempt; a retry instance without maxAttempts → 3.
    let i = import_text(
        Source::Resilience4j,
        "resilience4j.circuitbreaker.instances.a.slidingWindowSize: 20\n\
         resilience4j.retry.instances.b.waitDuration: 100ms\n",
    );
    assert_eq!((attempts(&i, "a"), attempts(&i, "b")), (1, 3), "{}", i.report.render());
    assert!(noted(&i, "a") && noted(&i, "b"), "{}", i.report.render());
    // Hystrix does not retry.
    let i = import_text(
        Source::Hystrix,
        "hystrix.command.pay.execution.isolation.thread.timeoutInMilliseconds: 300\n",
    );
    assert_eq!(attempts(&i, "pay"), 1, "{}", i.report.render());
    assert!(noted(&i, "pay"), "{}", i.report.render());
}

/// A dependency imported from a file with no concurrency limit gets Levee's bulkhead of
/// 25, and the report says so. Every call-bounding group the source does
/// not set (attempt timeout, retry, breaker, bulkhead) is named with its whole default in
/// force, read from the manifest; a group the source sets is not. The service-level
/// defaults (deadline, non-critical cap, the enforcing inbound limit) are named in one note.
#[test]
fn levee_defaults_the_source_does_not_set_are_named_in_the_notes() {
    let i =
        import_text(Source::Resilience4j, "resilience4j.circuitbreaker.instances.a.slidingWindowSize: 20\n");
    let note = i
        .report
        .notes
        .iter()
        .find(|n| n.starts_with("policy.dependencies.a: the source sets no equivalent of "))
        .unwrap_or_else(|| panic!("no defaults note in {:?}", i.report.notes));
    let d = &i.manifest.policy.dependencies["a"];
    let bulkhead = format!(
        "bulkhead = {{max_concurrent: {}, max_wait: {}}}",
        d.bulkhead.max_concurrent,
        levee_agent::policy::duration::format(d.bulkhead.max_wait)
    );
    assert!(note.contains(&bulkhead), "the whole group: {note}");
    assert!(
        note.contains(&format!(
            "attempt_timeout = {}",
            levee_agent::policy::duration::format(d.attempt_timeout)
        )),
        "{note}"
    );
    assert!(!note.contains("circuit_breaker = {"), "the source sets the breaker: {note}");
    assert!(!note.contains("circuit_breaker.window"), "the source sets the window: {note}");
    assert!(note.contains("circuit_breaker.slow_call_duration = none"), "the parts it does not set: {note}");
    assert!(note.contains("retry.budget = {"), "the retry budget, which no source sets: {note}");
    assert!(i.report.render().contains(note.as_str()), "printed with the report");

    // A group the source does not set at all is named in full: the breaker's window,
    // thresholds, slow-call, open and half-open settings; of the retry (whose attempts the
    // import always sets), the back-off and the budget.
    let i = import_text(Source::Resilience4j, "resilience4j.bulkhead.instances.b.maxConcurrentCalls: 4\n");
    let note = i
        .report
        .notes
        .iter()
        .find(|n| n.starts_with("policy.dependencies.b: the source sets no equivalent of "))
        .unwrap_or_else(|| panic!("no defaults note in {:?}", i.report.notes));
    let cb = &i.manifest.policy.dependencies["b"].circuit_breaker;
    let levee_agent::policy::Window::Count { size } = cb.window else { panic!("count window") };
    for part in [
        format!("window: {{size: {size}, type: count}}"),
        format!("minimum_calls: {}", cb.minimum_calls),
        format!("failure_rate_threshold: {}", cb.failure_rate_threshold),
        "slow_call_duration: none".to_string(),
        format!("slow_call_rate_threshold: {:?}", cb.slow_call_rate_threshold),
        format!("wait_in_open: {}", levee_agent::policy::duration::format(cb.wait_in_open)),
        format!("half_open_probes: {}", cb.half_open_probes),
        "retry.base = ".to_string(),
        "retry.budget = {capacity: ".to_string(),
    ] {
        assert!(note.contains(&part), "{part} missing from {note}");
    }
    assert!(!note.contains("bulkhead = {"), "the source sets the bulkhead: {note}");
    assert!(!note.contains("bulkhead.max_concurrent"), "the source sets it: {note}");
    assert!(note.contains("bulkhead.max_wait = "), "the part it does not set: {note}");

    // Service level: one note, with the inbound limit's algorithm, initial limit and mode.
    let p = &i.manifest.policy;
    let service: Vec<&String> =
        i.report.notes.iter().filter(|n| n.starts_with("policy: the source sets no equivalent")).collect();
    assert_eq!(service.len(), 1, "{:?}", i.report.notes);
    for part in [
        format!("default_deadline = {}", levee_agent::policy::duration::format(p.default_deadline)),
        format!("non_critical_cap = {}", levee_agent::policy::duration::format(p.non_critical_cap)),
        format!("algorithm: aimd, initial_limit: {}", p.inbound.limit.initial_limit),
        "inbound.mode = enforce".to_string(),
    ] {
        assert!(service[0].contains(&part), "{part} missing from {}", service[0]);
    }

    // A source that sets the inbound limit (Sentinel's system rule) gets only the mode.
    let i = import_text(Source::Sentinel, r#"[{"maxThread": 10}]"#);
    let service = i.report.notes.iter().find(|n| n.starts_with("policy: ")).unwrap();
    assert!(service.contains("inbound.mode = enforce") && !service.contains("inbound.limit ="), "{service}");
}

/// A value Levee does not allow is reported with the range and with what the manifest
/// holds instead.
#[test]
fn a_dropped_value_says_what_the_manifest_keeps_instead() {
    let i = import_text(
        Source::Resilience4j,
        "resilience4j.retry.instances.pricing:\n  maxAttempts: 20\n  waitDuration: 100ms\n\
         resilience4j.bulkhead.instances.pricing.maxConcurrentCalls: 0\n",
    );
    let d = &i.manifest.policy.dependencies["pricing"];
    let why = reason(&i, "resilience4j.retry.instances.pricing.maxAttempts");
    assert!(why.contains("must be between 1 and 10"), "{why}");
    assert!(
        why.ends_with(&format!(
            "; the manifest keeps Levee's default retry.max_attempts = {}",
            d.retry.max_attempts
        )),
        "{why}"
    );
    let why = reason(&i, "resilience4j.bulkhead.instances.pricing.maxConcurrentCalls");
    assert!(
        why.contains(&format!(
            "the manifest keeps Levee's default bulkhead.max_concurrent = {}",
            d.bulkhead.max_concurrent
        )),
        "{why}"
    );
}

/// Istio's `timeout: 5s` bounds the whole request, retries included: it is split over the
/// attempts, never a 5 s attempt timeout with Istio's 3 attempts (15 s and more).
#[test]
fn a_whole_request_timeout_is_split_over_the_attempts() {
    let vs = |http: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: r}}\nspec:\n  hosts: [r]\n  \
             http:\n  - route:\n    - destination: {{host: r}}\n{http}"
        )
    };
    let total = |i: &Imported, dep: &str| {
        let d = &i.manifest.policy.dependencies[dep];
        (d.attempt_timeout, d.retry.max_attempts)
    };
    // Istio, no retries: Istio's default 2 retries; 5s / 3 = 1666 ms (rounded down).
    let i = import_text(Source::Istio, &vs("    timeout: 5s\n"));
    assert_eq!(total(&i, "r"), (Duration::from_millis(1666), 3), "{}", i.report.render());
    let s = i.report.setting("spec.http[0].timeout").unwrap();
    assert!(
        s.notes.iter().any(|n| n.contains("by 5s")
            && n.contains("5s / 3 = 1s 666ms")
            && n.contains("rounded down")
            && n.contains("caller's deadline")),
        "{:?}",
        s.notes
    );
    // No retries at all: the whole timeout is the attempt's.
    let i = import_text(Source::Istio, &vs("    timeout: 5s\n    retries: {attempts: 0}\n"));
    assert_eq!(total(&i, "r"), (Duration::from_secs(5), 1));
    // A per-try timeout that fits is kept, and the total is reported as not mapped.
    let i =
        import_text(Source::Istio, &vs("    timeout: 5s\n    retries: {attempts: 1, perTryTimeout: 2s}\n"));
    assert_eq!(total(&i, "r"), (Duration::from_secs(2), 2));
    assert!(reason(&i, "spec.http[0].timeout").contains("2 attempts × 2s = 4s fit within its 5s"));
    // One that does not fit (3 × 2s > 5s) is lowered to 5s / 3; the attempts are kept.
    let i =
        import_text(Source::Istio, &vs("    timeout: 5s\n    retries: {attempts: 2, perTryTimeout: 2s}\n"));
    assert_eq!(total(&i, "r"), (Duration::from_millis(1666), 3));
    let s = i.report.setting("spec.http[0].retries.perTryTimeout").unwrap();
    assert!(s.notes.iter().any(|n| n.contains("lowered to 5s / 3 = 1s 666ms")), "{:?}", s.notes);
    // Never below Levee's shortest attempt timeout.
    let i = import_text(Source::Istio, &vs("    timeout: 2ms\n"));
    assert_eq!(total(&i, "r"), (levee_agent::policy::MIN_ATTEMPT_TIMEOUT, 3));

    // Envoy: route timeout without per_try_timeout, and Envoy's default 15 s.
    let envoy = |route: &str| {
        format!(
            "static_resources:\n  listeners:\n  - filter_chains:\n    - filters:\n      - name: hcm\n        \
             typed_config:\n          route_config:\n            virtual_hosts:\n            - name: a\n              \
             routes:\n              - match: {{prefix: /}}\n                route: {route}\n          \
             http_filters: []\n"
        )
    };
    let i =
        import_text(Source::Envoy, &envoy("{cluster: pricing, timeout: 3s, retry_policy: {num_retries: 2}}"));
    assert_eq!(total(&i, "pricing"), (Duration::from_secs(1), 3), "{}", i.report.render());
    let base = "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0].route";
    let s = i.report.setting(&format!("{base}.timeout")).unwrap();
    assert!(
        s.notes.iter().any(|n| n.contains("Envoy bounds the whole request, retries included, by 3s")),
        "{:?}",
        s.notes
    );
    assert!(!s.notes.iter().any(|n| n.contains("may use the whole route timeout")), "{:?}", s.notes);
    let i = import_text(Source::Envoy, &envoy("{cluster: pricing, retry_policy: {retry_on: 5xx}}"));
    assert_eq!(total(&i, "pricing"), (Duration::from_millis(7500), 2), "15s / 2 attempts");
    assert!(
        i.report.notes.iter().any(|n| n.starts_with(
            "policy.dependencies.pricing.attempt_timeout = 7s 500ms: Envoy's default route timeout"
        )),
        "{:?}",
        i.report.notes
    );
    let i = import_text(
        Source::Envoy,
        &envoy("{cluster: pricing, timeout: 1s, retry_policy: {num_retries: 3, per_try_timeout: 0.5s}}"),
    );
    assert_eq!(total(&i, "pricing"), (Duration::from_millis(250), 4), "4 × 0.5s > 1s: 1s / 4");
}

/// Two Envoy routes to one cluster with different settings are not merged field by field:
/// the first route's settings are taken as a whole, the other route's are reported, its
/// `cluster` is not called "not a timeout, retry … setting", and Istio does the same.
#[test]
fn routes_to_one_dependency_with_different_settings_take_the_first_and_report_the_conflict() {
    let text = "\
static_resources:
  listeners:
  - filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          route_config:
            virtual_hosts:
            - name: a
              routes:
              - match: {prefix: /a}
                route: {cluster: pricing, timeout: 0s}
              - match: {prefix: /b}
                route: {cluster: pricing, timeout: 3s, retry_policy: {num_retries: 2}}
          http_filters: []
";
    let i = import_text(Source::Envoy, text);
    let d = &i.manifest.policy.dependencies["pricing"];
    assert_eq!(d.retry.max_attempts, 1, "route /a: no retry_policy");
    assert_eq!(d.attempt_timeout, levee_agent::policy::DependencyPolicy::default().attempt_timeout, "/a: 0s");
    let vh = "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0]";
    assert!(
        mapped_to(&i, &format!("{vh}.routes[0].route.cluster")).contains(
            &"policy.dependencies.pricing.retry.max_attempts = 1 (no retry_policy: Envoy does not retry)"
                .to_string()
        )
    );
    for k in ["route.timeout", "route.retry_policy.num_retries", "route.cluster"] {
        let why = reason(&i, &format!("{vh}.routes[1].{k}"));
        assert!(
            why.contains(&format!("conflicts with {vh}.routes[0]")) && why.contains("retry.max_attempts = 3"),
            "{k}: {why}"
        );
    }
    assert!(reason(&i, &format!("{vh}.routes[1].route.cluster")).starts_with("names the destination"));
    assert!(
        i.report
            .notes
            .iter()
            .any(|n| n.starts_with("pricing: routes ") && n.contains("the first route's settings are taken")),
        "{:?}",
        i.report.notes
    );

    let text = "\
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: pricing}
spec:
  hosts: [pricing]
  http:
  - match: [{uri: {prefix: /a}}]
    route:
    - destination: {host: pricing}
    retries: {attempts: 0}
  - route:
    - destination: {host: pricing}
    timeout: 3s
    retries: {attempts: 2}
";
    let i = import_text(Source::Istio, text);
    let d = &i.manifest.policy.dependencies["pricing"];
    assert_eq!(d.retry.max_attempts, 1, "the first route's attempts: 0");
    assert_eq!(d.attempt_timeout, levee_agent::policy::DependencyPolicy::default().attempt_timeout);
    for k in ["timeout", "retries.attempts", "route[0].destination.host"] {
        let why = reason(&i, &format!("spec.http[1].{k}"));
        assert!(why.contains("conflicts with spec.http[0]"), "{k}: {why}");
    }
    assert!(i.report.notes.iter().any(|n| n.starts_with("pricing: routes spec.http[0] and spec.http[1]")));
}

/// In Istio `consecutive5xxErrors: 0` turns ejection on 5xx errors off: with no other
/// count that ejects, the manifest has no outlier detection (not Levee's count of 5).
#[test]
fn istio_consecutive_errors_of_zero_turn_ejection_off() {
    let rule = |od: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r}}\nspec:\n  host: reviews\n  \
             trafficPolicy:\n    outlierDetection: {od}\n"
        )
    };
    let i =
        import_text(Source::Istio, &rule("{consecutive5xxErrors: 0, interval: 5s, baseEjectionTime: 1m}"));
    let d = &i.manifest.policy.dependencies["reviews"];
    assert_eq!(d.outlier_detection, None, "{}", i.report.render());
    let json = serde_json::to_value(&i.manifest).unwrap();
    assert!(json["policy"]["dependencies"]["reviews"]["outlier_detection"].is_null(), "{json}");
    let to = mapped_to(&i, "spec.trafficPolicy.outlierDetection.consecutive5xxErrors");
    assert_eq!(to, ["policy.dependencies.reviews.outlier_detection = null"]);
    let shown = i.report.render();
    assert!(!shown.contains("Levee does not allow"), "{shown}");
    assert!(!shown.contains("consecutive_errors = 5"), "{shown}");
    assert!(shown.contains("consecutive5xxErrors: 0 turns off ejection"), "{shown}");
    assert!(reason(&i, "spec.trafficPolicy.outlierDetection.interval").contains("outlier detection is off"));
    assert!(
        reason(&i, "spec.trafficPolicy.outlierDetection.baseEjectionTime")
            .contains("outlier detection is off")
    );

    // Both counts 0: still off.
    let i = import_text(Source::Istio, &rule("{consecutive5xxErrors: 0, consecutiveGatewayErrors: 0}"));
    assert_eq!(i.manifest.policy.dependencies["reviews"].outlier_detection, None);

    // Another count ejects: Levee's one count is set from it, and the 0 says why it is not.
    let i = import_text(Source::Istio, &rule("{consecutive5xxErrors: 0, consecutiveGatewayErrors: 3}"));
    let od = i.manifest.policy.dependencies["reviews"].outlier_detection.clone().expect("on");
    assert_eq!(od.consecutive_errors, 3);
    let why = reason(&i, "spec.trafficPolicy.outlierDetection.consecutive5xxErrors");
    assert!(why.contains("0 turns off") && why.contains("set from consecutiveGatewayErrors"), "{why}");

    // A count that is not 0 is imported as before; no count at all keeps Istio's 5.
    let i = import_text(Source::Istio, &rule("{consecutive5xxErrors: 7}"));
    assert_eq!(
        i.manifest.policy.dependencies["reviews"].outlier_detection.clone().unwrap().consecutive_errors,
        7
    );
    let i = import_text(Source::Istio, &rule("{interval: 5s}"));
    assert_eq!(
        i.manifest.policy.dependencies["reviews"].outlier_detection.clone().unwrap().consecutive_errors,
        5
    );
}

/// The same rule for Envoy's `consecutive_5xx: 0`, the one count it imports.
#[test]
fn envoy_consecutive_5xx_of_zero_turns_ejection_off() {
    let text = "\
static_resources:
  clusters:
  - name: pricing
    outlier_detection: {consecutive_5xx: 0, interval: 5s}
";
    let i = import_text(Source::Envoy, text);
    assert_eq!(i.manifest.policy.dependencies["pricing"].outlier_detection, None);
    let to = mapped_to(&i, "static_resources.clusters[0].outlier_detection.consecutive_5xx");
    assert_eq!(to, ["policy.dependencies.pricing.outlier_detection = null"]);
    let shown = i.report.render();
    assert!(!shown.contains("Levee does not allow"), "{shown}");
    assert!(
        reason(&i, "static_resources.clusters[0].outlier_detection.interval")
            .contains("outlier detection is off")
    );
}

/// resilience4j's `timeoutDuration: 2s` becomes attempt_timeout 2s under Levee's
/// default_deadline of 1s, which `levee apply` would warn about. The import runs the agent's
/// lints on the policy it wrote and lists each warning, with a hint, without changing what
/// is mapped.
#[test]
fn an_imported_policy_levee_warns_about_has_the_warnings_in_its_report() {
    let i = super::import_file(
        Source::Resilience4j,
        "resilience4j/resilience4j__resilience4j-spring-boot2-demo__src__main__resources__application.yml",
    );
    let d = &i.manifest.policy.dependencies["backend-a"];
    assert_eq!(d.attempt_timeout, Duration::from_secs(2), "the mapping stays as the source says");
    assert_eq!(i.manifest.policy.default_deadline, Duration::from_secs(1));
    let found: Vec<(&str, &str)> =
        i.report.warnings.iter().map(|w| (w.path.as_str(), w.code.as_str())).collect();
    assert_eq!(
        found,
        [
            ("policy.dependencies.backend-a.retry", "retry_exceeds_deadline"),
            ("policy.dependencies.backend-a.attempt_timeout", "timeout_exceeds_budget"),
            ("policy.dependencies.backend-b.retry", "retry_exceeds_deadline"),
            ("policy.dependencies.backend-b.attempt_timeout", "timeout_exceeds_budget"),
        ]
    );
    // The same lints `levee apply` shows for the policy alone, with their messages.
    let lints = levee_agent::policy::lint(&i.manifest.policy);
    assert_eq!(lints.len(), i.report.warnings.len());
    for (l, w) in lints.iter().zip(&i.report.warnings) {
        assert_eq!(
            (format!("policy.{}", l.path), l.code, &l.message),
            (w.path.clone(), w.code.as_str(), &w.message)
        );
        assert!(
            w.hint.as_deref().is_some_and(|h| h.contains("raise policy.default_deadline in the manifest")),
            "{w:?}"
        );
    }
    let shown = i.report.render();
    let section = shown.split("\nwarnings (").nth(1).expect("a warnings section");
    assert!(
        section.contains(
            "  policy.dependencies.backend-a.attempt_timeout (timeout_exceeds_budget): attempt_timeout (2s) is longer \
             than the caller's default budget (1s)\n      hint: "
        ),
        "{shown}"
    );
    let json = serde_json::to_value(&i.report).unwrap();
    assert_eq!(json["warnings"][1]["code"], "timeout_exceeds_budget");
    assert_eq!(json["warnings"][1]["path"], "policy.dependencies.backend-a.attempt_timeout");
    assert!(json["warnings"][1]["hint"].as_str().unwrap().contains("policy.default_deadline"));

    // A policy the lints have nothing to say about: no section, an empty list in JSON.
    let i =
        import_text(Source::Resilience4j, "resilience4j.timelimiter.instances.a.timeoutDuration: 300ms\n");
    assert_eq!(i.report.warnings, [], "{}", i.report.render());
    assert!(!i.report.render().contains("warnings"));
    assert_eq!(serde_json::to_value(&i.report).unwrap()["warnings"], serde_json::json!([]));
}
