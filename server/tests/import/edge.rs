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

/// Found by a GitOps trial: names with no retry in the source were imported with Levee's
/// default of 3 attempts and no note, adding retries the source never made.
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

/// Found by a GitOps trial: a dependency imported from a file with no concurrency limit
/// got Levee's bulkhead of 25 without a word. Every call-bounding group the source does
/// not set (attempt timeout, retry, breaker, bulkhead) is named with the default in force;
/// a group the source sets is not.
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
    assert!(note.contains(&format!("bulkhead.max_concurrent = {}", d.bulkhead.max_concurrent)), "{note}");
    assert!(note.contains("attempt_timeout = "), "{note}");
    assert!(!note.contains("circuit_breaker"), "the source sets the breaker: {note}");
    assert!(i.report.render().contains(note.as_str()), "printed with the report");
}
