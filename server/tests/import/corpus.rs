//! Every corpus file imports, validates, survives the manifest round trip, and reports
//! the asserted number of settings, mapped and not mapped; spot checks of key values.

use std::time::Duration;

use levee_agent::policy::{FlagType, LimitAlgorithm, Window};
use levee_server::import::{Outcome, Source};
use levee_server::manifest;

use super::{corpus_dir, import_file, mapped_to, reason};

/// (file, source, settings, mapped, not mapped).
const CORPUS: &[(&str, Source, usize, usize, usize)] = &[
    (
        "envoy/cilium__cilium__examples__kubernetes__servicemesh__envoy__envoy-circuit-breaker.yaml",
        Source::Envoy,
        33,
        4,
        29,
    ),
    (
        "envoy/cilium__cilium__examples__kubernetes__servicemesh__envoy__envoy-traffic-management-test.yaml",
        Source::Envoy,
        43,
        6,
        37,
    ),
    ("envoy/envoyproxy__envoy__configs__google-vrp__envoy-edge.yaml", Source::Envoy, 49, 2, 47),
    ("envoy/envoyproxy__envoy__examples__fault-injection__envoy.yaml", Source::Envoy, 32, 2, 30),
    ("envoy/solo-io__hoot__11-hitless-delpoy__envoy.yaml", Source::Envoy, 50, 5, 45),
    (
        "hystrix/Netflix__recipes-rss__rss-edge__src__main__resources__edge.properties",
        Source::Hystrix,
        17,
        6,
        11,
    ),
    ("hystrix/dromara__lamp-cloud__third-party__nacos__clientConfig__common.yml", Source::Hystrix, 21, 4, 17),
    (
        "hystrix/sqshq__piggymetrics__config__src__main__resources__shared__gateway.yml",
        Source::Hystrix,
        23,
        5,
        18,
    ),
    (
        "istio/PacktPublishing__Microservices-with-Spring-Boot-and-Spring-Cloud-Third-Edition__Chapter20__kubernetes__resilience-tests__product-virtual-service-with-delay.yml",
        Source::Istio,
        7,
        1,
        6,
    ),
    (
        "istio/PacktPublishing__Microservices-with-Spring-Boot-and-Spring-Cloud-Third-Edition__Chapter20__kubernetes__resilience-tests__product-virtual-service-with-faults.yml",
        Source::Istio,
        7,
        1,
        6,
    ),
    (
        "istio/redhat-scholars__istio-tutorial__istiofiles__destination-rule-recommendation_cb_policy_pool_ejection.yml",
        Source::Istio,
        23,
        9,
        14,
    ),
    (
        "istio/redhat-scholars__istio-tutorial__istiofiles__destination-rule-recommendation_cb_policy_version_v2.yml",
        Source::Istio,
        15,
        5,
        10,
    ),
    (
        "istio/redhat-scholars__istio-tutorial__istiofiles__virtual-service-no-retries.yml",
        Source::Istio,
        18,
        6,
        12,
    ),
    (
        "istio/redhat-scholars__istio-tutorial__istiofiles__virtual-service-recommendation-timeout.yml",
        Source::Istio,
        6,
        2,
        4,
    ),
    (
        "istio/redhat-scholars__istio-tutorial__istiofiles__virtual-service-recommendation-v2_retry.yml",
        Source::Istio,
        7,
        3,
        4,
    ),
    (
        "resilience4j/PacktPublishing__Microservices-with-Spring-Boot-and-Spring-Cloud-Third-Edition__Chapter13__config-repo__product-composite.yml",
        Source::Resilience4j,
        14,
        8,
        6,
    ),
    (
        "resilience4j/ThomasVitale__cloud-native-spring-in-action__Chapter09__09-end__edge-service__src__main__resources__application.yml",
        Source::Resilience4j,
        57,
        7,
        50,
    ),
    (
        "resilience4j/apache__fineract__fineract-provider__src__main__resources__application.properties",
        Source::Resilience4j,
        19,
        16,
        3,
    ),
    (
        "resilience4j/eclipse-tractusx__item-relationship-service__irs-api__src__main__resources__application.yml",
        Source::Resilience4j,
        6,
        5,
        1,
    ),
    (
        "resilience4j/eugenp__tutorials__spring-boot-modules__spring-boot-resilience4j__src__main__resources__application.yml",
        Source::Resilience4j,
        26,
        14,
        12,
    ),
    (
        "resilience4j/ihuaylupo__manning-smia__chapter7__licensing-service__src__main__resources__bootstrap.yml",
        Source::Resilience4j,
        31,
        12,
        19,
    ),
    (
        "resilience4j/in28minutes__spring-microservices-v3__03.microservices__currency-exchange-service__src__main__resources__application.properties",
        Source::Resilience4j,
        17,
        5,
        12,
    ),
    (
        "resilience4j/resilience4j__resilience4j-spring-boot2-demo__src__main__resources__application.yml",
        Source::Resilience4j,
        70,
        21,
        49,
    ),
    (
        "resilience4j/resilience4j__resilience4j__resilience4j-spring-boot3__src__test__resources__application.yaml",
        Source::Resilience4j,
        145,
        52,
        93,
    ),
    (
        "resilience4j/thombergs__code-examples__resilience4j__springboot-resilience4j__src__main__resources__application.yml",
        Source::Resilience4j,
        51,
        22,
        29,
    ),
    (
        "sentinel/alibaba__Sentinel__sentinel-demo__sentinel-demo-dynamic-file-rule__src__main__resources__DegradeRule.json",
        Source::Sentinel,
        10,
        8,
        2,
    ),
    (
        "sentinel/alibaba__Sentinel__sentinel-demo__sentinel-demo-dynamic-file-rule__src__main__resources__FlowRule.json",
        Source::Sentinel,
        12,
        0,
        12,
    ),
    (
        "sentinel/alibaba__spring-cloud-alibaba__spring-cloud-alibaba-examples__sentinel-example__sentinel-core-example__src__main__resources__flowrule.json",
        Source::Sentinel,
        18,
        6,
        12,
    ),
    (
        "sentinel/alibaba__spring-cloud-alibaba__spring-cloud-alibaba-examples__sentinel-example__sentinel-openfeign-example__src__main__resources__degraderule.json",
        Source::Sentinel,
        11,
        6,
        5,
    ),
    (
        "sentinel/alibaba__spring-cloud-alibaba__spring-cloud-alibaba-starters__spring-cloud-starter-alibaba-sentinel__src__test__resources__system.json",
        Source::Sentinel,
        4,
        1,
        3,
    ),
];

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn every_corpus_file_imports_validates_and_reports_every_setting() {
    for &(file, source, settings, mapped, not_mapped) in CORPUS {
        let i = import_file(source, file);
        i.manifest.validate().unwrap_or_else(|e| panic!("{file}: {e}"));
        let r = &i.report;
        assert_eq!(
            (r.settings.len(), r.mapped(), r.not_mapped()),
            (settings, mapped, not_mapped),
            "{file}\n{}",
            r.render()
        );
        for s in &r.settings {
            match &s.outcome {
                Outcome::Mapped { to } => assert!(!to.is_empty(), "{file}: {}", s.path),
                Outcome::NotMapped { reason } => {
                    assert!(!reason.trim().is_empty(), "{file}: {} has no reason", s.path)
                }
            }
        }
        let yaml = manifest::to_yaml(std::slice::from_ref(&i.manifest));
        let back = manifest::parse(file, &yaml).unwrap_or_else(|e| panic!("{file}: {e}\n{yaml}"));
        assert_eq!(back, vec![i.manifest.clone()], "{file}");
    }
}

#[test]
fn the_table_names_every_corpus_file() {
    let mut on_disk = Vec::new();
    for kind in std::fs::read_dir(corpus_dir()).unwrap() {
        let kind = kind.unwrap().path();
        if kind.is_dir() {
            for f in std::fs::read_dir(&kind).unwrap() {
                let f = f.unwrap().path();
                on_disk.push(format!(
                    "{}/{}",
                    kind.file_name().unwrap().to_str().unwrap(),
                    f.file_name().unwrap().to_str().unwrap()
                ));
            }
        }
    }
    on_disk.sort();
    let mut listed: Vec<String> = CORPUS.iter().map(|c| c.0.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
    assert_eq!(listed.len(), 30, "SOURCES.md counts 30 files");
}

#[test]
fn resilience4j_bare_numbers_are_milliseconds_and_percent_becomes_a_ratio() {
    let i = import_file(Source::Resilience4j, CORPUS[15].0);
    let d = &i.manifest.policy.dependencies["product"];
    assert_eq!(d.attempt_timeout, ms(2000));
    assert_eq!(d.retry.max_attempts, 3);
    assert_eq!((d.retry.base, d.retry.cap), (ms(1000), ms(1000)), "waitDuration: 1000 is 1s, constant");
    assert_eq!(d.circuit_breaker.window, Window::Count { size: 5 });
    assert_eq!(d.circuit_breaker.minimum_calls, 5, "resilience4j caps its default 100 at the window size");
    assert_eq!(d.circuit_breaker.failure_rate_threshold, 0.5);
    assert_eq!(
        (d.circuit_breaker.wait_in_open, d.circuit_breaker.max_wait_in_open),
        (ms(10_000), ms(10_000))
    );
    assert_eq!(d.circuit_breaker.half_open_probes, 3);
    assert!(reason(&i, "resilience4j.retry.instances.product.retryExceptions").contains("error kind"));
}

#[test]
fn resilience4j_configs_default_reaches_gateway_named_instances() {
    let i = import_file(Source::Resilience4j, CORPUS[16].0);
    for dep in ["catalog-circuit-breaker", "order-circuit-breaker"] {
        let d = &i.manifest.policy.dependencies[dep];
        assert_eq!(d.circuit_breaker.window, Window::Count { size: 20 });
        assert_eq!(d.circuit_breaker.wait_in_open, ms(15_000), "bare 15000");
        assert_eq!(d.circuit_breaker.half_open_probes, 5);
        assert_eq!(d.attempt_timeout, ms(5000));
    }
    assert!(
        reason(&i, "spring.cloud.gateway.default-filters[2].args.retries").contains("Spring Cloud Gateway")
    );
}

#[test]
fn resilience4j_placeholders_take_their_default_and_say_so() {
    let i = import_file(Source::Resilience4j, CORPUS[17].0);
    let d = &i.manifest.policy.dependencies["execute-command"];
    assert_eq!(d.retry.max_attempts, 3);
    assert_eq!((d.retry.base, d.retry.cap), (ms(1000), ms(2000)), "1s x2 over 3 attempts: delays 1s, 2s");
    let s = i.report.setting("resilience4j.retry.instances.executeCommand.max-attempts").unwrap();
    assert!(
        s.notes.iter().any(|n| n.contains("${FINERACT_COMMAND_PROCESSING_RETRY_MAX_ATTEMPTS}")),
        "{:?}",
        s.notes
    );
}

#[test]
fn resilience4j_legacy_keys_and_aliases() {
    let i = import_file(Source::Resilience4j, CORPUS[20].0);
    let ls = &i.manifest.policy.dependencies["license-service"];
    assert_eq!(ls.circuit_breaker.window, Window::Count { size: 5 }, "ringBufferSizeInClosedState");
    assert_eq!(ls.circuit_breaker.half_open_probes, 3, "ringBufferSizeInHalfOpenState");
    assert_eq!(
        i.manifest.policy.dependencies["organization-service"].circuit_breaker.failure_rate_threshold,
        0.6
    );
    let retry = &i.manifest.policy.dependencies["retry-license-service"].retry;
    assert_eq!((retry.max_attempts, retry.base), (5, ms(10_000)), "maxRetryAttempts, bare 10000");
    let bh = &i.manifest.policy.dependencies["bulkhead-license-service"].bulkhead;
    assert_eq!((bh.max_concurrent, bh.max_wait), (20, ms(2)));
    assert!(
        reason(&i, "resilience4j.thread-pool-bulkhead.instances.bulkheadLicenseService.maxThreadPoolSize")
            .contains("semaphore bulkhead")
    );
    assert_eq!(i.manifest.service, "svc");

    let boot3 = import_file(Source::Resilience4j, CORPUS[23].0);
    let c = &boot3.manifest.policy.dependencies["backend-c"].circuit_breaker;
    assert_eq!((c.wait_in_open, c.max_wait_in_open), (ms(1000), ms(1111)), "exponential open period, capped");
    let r = &boot3.manifest.policy.dependencies["retry-backend-c"].retry;
    assert_eq!((r.base, r.cap), (ms(100), ms(200)), "100ms x2 over 3 attempts, under the 222ms cap");
    assert_eq!(
        boot3.manifest.policy.dependencies["backend-b"].circuit_breaker.window,
        Window::Time { seconds: 10 }
    );
    assert!(
        reason(&boot3, "resilience4j.ratelimiter.limiters.backendB.limitForPeriod").contains("rate limiter")
    );
}

#[test]
fn envoy_clusters_routes_and_faults() {
    let cb = import_file(Source::Envoy, CORPUS[0].0);
    let d = &cb.manifest.policy.dependencies["default-echo-service"];
    assert_eq!(d.bulkhead.max_concurrent, 2, "max_requests");
    let od = d.outlier_detection.as_ref().unwrap();
    assert_eq!((od.consecutive_errors, od.max_ejection_percent), (5, 10), "Envoy's defaults");
    assert!(
        reason(&cb, "spec.resources[2].circuit_breakers.thresholds[0].max_pending_requests")
            .contains("queue")
    );
    assert!(reason(&cb, "spec.resources[2].connect_timeout").contains("connect"));

    let tm = import_file(Source::Envoy, CORPUS[1].0);
    for dep in ["default-echo-service-1", "default-echo-service-2"] {
        let d = &tm.manifest.policy.dependencies[dep];
        assert_eq!(
            (d.retry.max_attempts, d.attempt_timeout),
            (4, ms(1000)),
            "num_retries 3, per_try_timeout 1s"
        );
    }
    assert!(
        reason(&tm, "spec.resources[1].virtual_hosts[0].routes[0].route.retry_policy.retry_on")
            .contains("only 502/503/504")
    );

    let hoot = import_file(Source::Envoy, CORPUS[4].0);
    let up = &hoot.manifest.policy.dependencies["upstream"];
    assert_eq!(up.retry.max_attempts, 3, "virtual-host retry_policy num_retries 2");
    assert_eq!(up.outlier_detection.as_ref().unwrap().consecutive_errors, 3);

    let fault = import_file(Source::Envoy, CORPUS[3].0);
    let why = reason(
        &fault,
        "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.abort.percentage.numerator",
    );
    assert!(why.contains("abort with HTTP 503 on 0 percent") && why.contains("local_service"), "{why}");
    assert_eq!(
        fault.manifest.policy.dependencies["local_service"].attempt_timeout,
        ms(15_000),
        "Envoy's default route timeout"
    );
}

#[test]
fn istio_durations_retries_outliers_and_faults() {
    let t = import_file(Source::Istio, CORPUS[13].0);
    let d = &t.manifest.policy.dependencies["recommendation"];
    assert_eq!(
        (d.attempt_timeout, d.retry.max_attempts),
        (ms(333), 3),
        "timeout 1.000s bounds the whole request; Istio's default 2 retries: 1s / 3 attempts"
    );
    let s = t.report.setting("spec.http[0].timeout").unwrap();
    assert!(s.notes.iter().any(|n| n.contains("1s / 3 = 333ms")), "{:?}", s.notes);

    let ej = import_file(Source::Istio, CORPUS[10].0);
    let od = ej.manifest.policy.dependencies["recommendation"].outlier_detection.clone().unwrap();
    assert_eq!(
        (od.consecutive_errors, od.interval, od.base_ejection_time, od.max_ejection_percent),
        (1, ms(5000), ms(15_000), 100)
    );

    let v2 = import_file(Source::Istio, CORPUS[11].0);
    let od = v2.manifest.policy.dependencies["recommendation"].outlier_detection.clone().unwrap();
    assert_eq!((od.base_ejection_time, od.interval), (ms(180_000), ms(1000)), "3m, 1s");
    assert!(reason(&v2, "spec.trafficPolicy.connectionPool.http.http1MaxPendingRequests").contains("queue"));

    let none = import_file(Source::Istio, CORPUS[12].0);
    for dep in ["customer", "preference", "recommendation"] {
        assert_eq!(none.manifest.policy.dependencies[dep].retry.max_attempts, 1, "attempts: 0");
    }
    assert_eq!(none.report.documents, 3);

    let retry = import_file(Source::Istio, CORPUS[14].0);
    let d = &retry.manifest.policy.dependencies["recommendation"];
    assert_eq!((d.retry.max_attempts, d.attempt_timeout), (4, ms(2000)));

    let faults = import_file(Source::Istio, CORPUS[9].0);
    assert!(
        reason(&faults, "spec.http[0].fault.abort.percentage.value")
            .contains("abort with HTTP 500 on 20 percent")
    );
    let delay = import_file(Source::Istio, CORPUS[8].0);
    let s = delay.report.setting("spec.http[0].fault.delay.percent").unwrap();
    assert!(
        matches!(&s.outcome, Outcome::NotMapped { reason } if reason.contains("delay of 3s on 100 percent"))
    );
    assert!(s.notes.iter().any(|n| n.contains("deprecated")));
}

#[test]
fn sentinel_rules_units_and_kill_switch() {
    let new = import_file(Source::Sentinel, CORPUS[28].0);
    let cb = &new.manifest.policy.dependencies["httpbin.org"].circuit_breaker;
    assert_eq!(cb.slow_call_duration, Some(ms(2)), "RT > 1 ms");
    assert_eq!(cb.slow_call_rate_threshold, 0.1, "a 0-1 ratio stays a ratio");
    assert_eq!((cb.wait_in_open, cb.minimum_calls, cb.window), (ms(30_000), 1, Window::Time { seconds: 1 }));
    assert!(reason(&new, "[0].grade").contains("exception-count"));

    let old = import_file(Source::Sentinel, CORPUS[25].0);
    assert_eq!(old.manifest.policy.dependencies["abc0"].circuit_breaker.slow_call_duration, Some(ms(21)));
    assert_eq!(old.manifest.policy.dependencies["abc1"].circuit_breaker.slow_call_duration, Some(ms(16)));
    assert_eq!(old.manifest.policy.dependencies["abc1"].circuit_breaker.wait_in_open, ms(10_000));
    assert!(reason(&old, "[0].passCount").contains("obsolete"));

    let flow = import_file(Source::Sentinel, CORPUS[27].0);
    let d = &flow.manifest.policy.dependencies["www.taobao.com"];
    assert_eq!(d.enabled_flag.as_deref(), Some("www.taobao.com.enabled"));
    let f = &flow.manifest.flags["www.taobao.com.enabled"];
    assert_eq!((f.kind, f.value.clone()), (FlagType::Bool, serde_json::json!(false)));
    assert!(reason(&flow, "[0].count").contains("QPS"));

    let sys = import_file(Source::Sentinel, CORPUS[29].0);
    let limit = &sys.manifest.policy.inbound.limit;
    assert_eq!((limit.algorithm, limit.initial_limit), (LimitAlgorithm::Fixed, 10));
    assert_eq!(reason(&sys, "[0].avgRt"), "-1 means not set");
}

#[test]
fn hystrix_and_ribbon_timeouts_retries_and_pools() {
    let rss = import_file(Source::Hystrix, CORPUS[5].0);
    let deps = &rss.manifest.policy.dependencies;
    assert_eq!(
        (deps["rss-add"].attempt_timeout, deps["rss-del"].attempt_timeout, deps["rss-get"].attempt_timeout),
        (ms(5000), ms(2000), ms(10_000))
    );
    assert_eq!(
        deps["rss-add"].circuit_breaker.window,
        Window::Time { seconds: 10 },
        "Hystrix's default window"
    );
    assert_eq!(
        (deps["middletier-client"].retry.max_attempts, deps["middletier-client"].attempt_timeout),
        (4, ms(3000))
    );

    let lamp = import_file(Source::Hystrix, CORPUS[6].0);
    let d = &lamp.manifest.policy.dependencies["zuihou-file-server"];
    assert_eq!((d.attempt_timeout, d.bulkhead.max_concurrent, d.retry.max_attempts), (ms(300_000), 1000, 2));
    assert!(
        reason(&lamp, "hystrix.command.zuihou-file-server.execution.isolation.thread.timeoutInMilliseconds")
            .contains("smaller")
    );
    assert!(reason(&lamp, "hystrix.threadpool.default.maxQueueSize").contains("queue"));

    let piggy = import_file(Source::Hystrix, CORPUS[7].0);
    let deps = &piggy.manifest.policy.dependencies;
    assert_eq!(
        deps.keys().collect::<Vec<_>>(),
        ["account-service", "notification-service", "statistics-service"]
    );
    assert_eq!(deps["account-service"].attempt_timeout, ms(20_000));
    assert!(
        mapped_to(&piggy, "hystrix.command.default.execution.isolation.thread.timeoutInMilliseconds").len()
            == 3
    );
}
