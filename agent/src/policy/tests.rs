use super::*;

fn check(json: &str) -> Result<ServiceConfig, PolicyError> {
    decode_config(json.as_bytes())
}

#[test]
fn empty_object_gives_all_defaults() {
    let cfg = check("{}").unwrap();
    assert_eq!(cfg, ServiceConfig::default());
    assert_eq!(cfg.policy.default_deadline, defaults::DEFAULT_DEADLINE);
}

#[test]
fn empty_body_is_malformed_not_defaults() {
    assert!(matches!(check(""), Err(PolicyError::Malformed { .. })));
    assert!(matches!(check("null"), Err(PolicyError::Malformed { .. })));
}

/// CP-3: serde accepts a struct written as an array (`[]` → all defaults); an empty or
/// truncated payload of that shape must not clear the rules.
#[test]
fn cp_3_structs_written_as_arrays_are_malformed() {
    for (body, path) in [
        ("[]", "."),
        (r#"{"policy": []}"#, "policy"),
        (r#"{"policy": {"dependencies": {"p": []}}}"#, "policy.dependencies.p"),
        (r#"{"policy": {"dependencies": {"p": {"retry": []}}}}"#, "policy.dependencies.p.retry"),
        (r#"{"flags": {"f": ["bool", true]}}"#, "flags.f"),
    ] {
        match check(body) {
            Err(PolicyError::Malformed { path: p, .. }) => assert_eq!(p, path, "{body}"),
            other => panic!("{body} → {other:?}"),
        }
    }
    // Arrays where the model has arrays, and JSON flag values, are fine.
    check(r#"{"flags": {"f": {"type": "json", "value": []}}, "faults": []}"#).unwrap();
}

#[test]
fn durations_take_units_and_dependency_defaults_fill_in() {
    let cfg = check(
        r#"{"policy":{"dependencies":{"pricing":{"attempt_timeout":"300ms","retry":{"max_attempts":2}}}}}"#,
    )
    .unwrap();
    let dep = &cfg.policy.dependencies["pricing"];
    assert_eq!(dep.attempt_timeout, std::time::Duration::from_millis(300));
    assert_eq!(dep.retry.max_attempts, 2);
    assert_eq!(dep.retry.base, defaults::RETRY_BASE);
    assert_eq!(dep.bulkhead.max_concurrent, defaults::BULKHEAD_MAX_CONCURRENT);
}

#[test]
fn unknown_field_is_rejected_with_its_path() {
    let err = check(r#"{"policy":{"dependencies":{"pricing":{"retry":{"max_attempt":2}}}}}"#).unwrap_err();
    match err {
        PolicyError::Malformed { path, message, .. } => {
            assert_eq!(path, "policy.dependencies.pricing.retry.max_attempt");
            assert!(message.contains("max_attempt"), "{message}");
        }
        other => panic!("expected malformed, got {other:?}"),
    }
}

#[test]
fn every_out_of_range_field_is_reported_at_once() {
    let err = check(
        r#"{"policy":{"dependencies":{"pricing":{
            "retry":{"max_attempts":11,"budget":{"ratio":1.5}},
            "circuit_breaker":{"failure_rate_threshold":0,"half_open_probes":0},
            "bulkhead":{"max_concurrent":0}}}}}"#,
    )
    .unwrap_err();
    let fields: Vec<String> = err.field_errors().into_iter().map(|e| e.path).collect();
    assert_eq!(
        fields,
        vec![
            "policy.dependencies.pricing.retry.max_attempts",
            "policy.dependencies.pricing.retry.budget.ratio",
            "policy.dependencies.pricing.circuit_breaker.failure_rate_threshold",
            "policy.dependencies.pricing.circuit_breaker.half_open_probes",
            "policy.dependencies.pricing.bulkhead.max_concurrent",
        ]
    );
    let text = err.to_string();
    assert!(text.contains("must be between 1 and 10 (got 11)"), "{text}");
}

#[test]
fn flag_value_must_match_its_type() {
    let err = check(r#"{"flags":{"a.enabled":{"type":"bool","value":"yes"}}}"#).unwrap_err();
    assert_eq!(err.field_errors()[0].path, "flags.a.enabled.value");
    let ok = check(r#"{"flags":{"n":{"type":"int","value":5,"stale":{"revert_after":"1h"}}}}"#).unwrap();
    assert_eq!(ok.flags["n"].stale, StalePolicy::RevertAfter(std::time::Duration::from_secs(3600)));
}

#[test]
fn a_typed_flag_value_is_read_by_its_type() {
    assert_eq!(FlagType::Bool.parse_text(" false "), Ok(false.into()));
    assert!(FlagType::Bool.parse_text("no").unwrap_err().contains("true or false"));
    assert_eq!(FlagType::Int.parse_text(" 42 "), Ok(42.into()));
    assert!(FlagType::Int.parse_text("4.2").is_err());
    assert_eq!(FlagType::Float.parse_text("0.25"), Ok(0.25.into()));
    for not_finite in ["NaN", "inf", "-inf"] {
        assert!(FlagType::Float.parse_text(not_finite).is_err(), "{not_finite}");
    }
    assert_eq!(FlagType::String.parse_text(" a b "), Ok(" a b ".into()));
    assert_eq!(FlagType::Json.parse_text(r#" {"a":1} "#), Ok(serde_json::json!({"a": 1})));
    assert!(FlagType::Json.parse_text("{").unwrap_err().starts_with("is a json flag"));
    // Whatever parse_text reads, the type check accepts.
    for (kind, text) in [(FlagType::Bool, "true"), (FlagType::Int, "-7"), (FlagType::Float, "1e3")] {
        let v = kind.parse_text(text).unwrap();
        assert_eq!(kind.check("value", &v), Ok(()));
    }
}

#[test]
fn the_type_check_names_the_path_and_cuts_a_long_value() {
    let e = FlagType::Int.check("flags.n.value", &serde_json::json!("x".repeat(200))).unwrap_err();
    assert_eq!(e.path, "flags.n.value");
    assert_eq!(e.message, "must be an int value, as the flag's type says");
    assert!(e.value.chars().count() <= 81, "{}", e.value);
}

#[test]
fn window_is_tagged_and_checked() {
    let cfg = check(
        r#"{"policy":{"dependencies":{"r":{"circuit_breaker":{"window":{"type":"time","seconds":10}}}}}}"#,
    )
    .unwrap();
    assert_eq!(cfg.policy.dependencies["r"].circuit_breaker.window, Window::Time { seconds: 10 });
    let err = check(
        r#"{"policy":{"dependencies":{"r":{"circuit_breaker":{"window":{"type":"count","size":10},"minimum_calls":20}}}}}"#,
    )
    .unwrap_err();
    assert_eq!(err.field_errors()[0].path, "policy.dependencies.r.circuit_breaker.minimum_calls");
}

#[test]
fn faults_need_an_expiry_and_a_known_dependency() {
    let err = check(
        r#"{"faults":[{"id":"f1","dependency":"x","action":{"type":"connection_error"},"percent":10}]}"#,
    )
    .unwrap_err();
    assert!(matches!(err, PolicyError::Malformed { .. }), "missing expires_at must not decode: {err}");
    let err = check(
        r#"{"faults":[{"id":"f1","dependency":"x","action":{"type":"abort","status":200},"percent":10,
            "expires_at":"2030-01-01T00:00:00Z"}]}"#,
    )
    .unwrap_err();
    let paths: Vec<String> = err.field_errors().into_iter().map(|e| e.path).collect();
    assert_eq!(paths, vec!["faults[0].dependency", "faults[0].action.status"]);
}

/// A fault rule's instances (an experiment's blast radius) are instance ids, bounded.
#[test]
fn fault_rule_instances_are_instance_ids() {
    let err = check(
        r#"{"faults":[{"id":"f1","dependency":"x","action":{"type":"connection_error"},"percent":10,
            "expires_at":"2030-01-01T00:00:00Z","instances":["checkout-7f3a9c01","bad id",""]}]}"#,
    )
    .unwrap_err();
    let paths: Vec<String> = err.field_errors().into_iter().map(|e| e.path).collect();
    assert_eq!(paths, vec!["faults[0].dependency", "faults[0].instances[1]", "faults[0].instances[2]"]);
}

#[test]
fn matrix_rows_reference_declared_dependencies() {
    let err = check(
        r#"{"policy":{"degradation_matrix":[{"feature":"Price","dependencies":["pricing"],"on_failure":"feature_error"}]}}"#,
    )
    .unwrap_err();
    assert_eq!(err.field_errors()[0].path, "policy.degradation_matrix[0].dependencies[0]");
}

#[test]
fn example_policy_of_the_spec_round_trips() {
    let json = include_str!("../../tests/data/checkout-config.json");
    let cfg = check(json).unwrap();
    let bytes = canonical_json(&cfg);
    let again = decode_config(&bytes).unwrap();
    assert_eq!(cfg, again);
    assert_eq!(content_hash(&bytes), content_hash(&canonical_json(&again)));
}

#[test]
fn lint_flags_retry_longer_than_deadline() {
    let cfg = check(
        r#"{"policy":{"default_deadline":"500ms","dependencies":{"p":{"attempt_timeout":"300ms","retry":{"max_attempts":3}}}}}"#,
    )
    .unwrap();
    let codes: Vec<&str> = lint(&cfg.policy).iter().map(|l| l.code).collect();
    assert_eq!(codes, vec!["retry_exceeds_deadline"]);
}

#[test]
fn admission_and_throttling_fields_are_checked_with_their_ranges() {
    let err = check(
        r#"{"policy":{"inbound":{"limit":{"smoothing":0},"read_only_flag":"Read Only",
            "mode":"shadow","max_header_criticality":"SHEDDABLE","queue":{"flush_generation":7},
            "routes":{"POST /orders":{"mutating":true}}},
            "client_throttle":{"k":0.5,"window":"0s"}}}"#,
    )
    .unwrap_err();
    let errors = err.field_errors();
    let fields: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        fields,
        [
            "policy.inbound.limit.smoothing",
            "policy.inbound.read_only_flag",
            "policy.client_throttle.k",
            "policy.client_throttle.window",
        ]
    );
    let text = err.to_string();
    assert!(text.contains("k: must be between 1 and 10 (got 0.5)"), "{text}");
    assert!(text.contains("window: must be between 1s and 1h"), "{text}");
    // Absent, they take the named defaults.
    let cfg = check("{}").unwrap();
    assert_eq!(cfg.policy.client_throttle.k, defaults::THROTTLE_K);
    assert_eq!(cfg.policy.inbound.max_header_criticality, defaults::MAX_HEADER_CRITICALITY);
    assert_eq!(cfg.policy.inbound.mode, AdmissionMode::Enforce);
    assert_eq!(cfg.policy.inbound.limit.smoothing, None);
    let ok = check(r#"{"policy":{"inbound":{"mode":"shadow","read_only_flag":"shop.read_only"}}}"#).unwrap();
    assert_eq!(ok.policy.inbound.read_only_flag.as_deref(), Some("shop.read_only"));
}

/// The model types' Rust names (`DependencyPolicy`, …) differ from the runtime types';
/// the API document keeps the schema names clients know.
#[cfg(feature = "openapi")]
#[test]
fn renamed_model_types_keep_their_schema_names() {
    use utoipa::ToSchema;
    assert_eq!(DependencyPolicy::name(), "Dependency");
    assert_eq!(CircuitBreakerPolicy::name(), "CircuitBreaker");
    assert_eq!(BulkheadPolicy::name(), "Bulkhead");
    assert_eq!(RetryBudgetPolicy::name(), "RetryBudget");
}

fn lints(json: &str) -> Vec<(String, &'static str)> {
    lint(&check(json).unwrap().policy).into_iter().map(|l| (l.path, l.code)).collect()
}

#[test]
fn lint_reads_retry_and_timeout_set_on_an_operation_override() {
    // The dependency itself is fine; its operations set what the lints warn about.
    let found = lints(
        r#"{"policy":{"default_deadline":"500ms","dependencies":{"p":{"attempt_timeout":"100ms",
            "retry":{"max_attempts":1},"operations":{
              "GET /quote/{sku}":{"retry":{"max_attempts":3}, "attempt_timeout":"300ms"},
              "GET /slow":{"attempt_timeout":"2s"},
              "GET /inherits":{"idempotent":true}}}}}}"#,
    );
    assert_eq!(
        found,
        vec![
            ("dependencies.p.operations.GET /quote/{sku}.retry".to_string(), "retry_exceeds_deadline"),
            ("dependencies.p.operations.GET /slow.attempt_timeout".to_string(), "timeout_exceeds_budget"),
        ]
    );
}

#[test]
fn lint_compares_route_deadlines_with_every_worst_case() {
    // Worst case of p: 3 × 50 ms + backoff 50 ms + 100 ms = 300 ms: within default_deadline
    // (1 s), beyond the route's 200 ms.
    let cfg = check(
        r#"{"policy":{"dependencies":{"p":{"attempt_timeout":"50ms","retry":{"max_attempts":3,"base":"50ms"}},
              "q":{"attempt_timeout":"150ms","retry":{"max_attempts":1}}},
            "inbound":{"routes":{"GET /quote/{sku}":{"deadline":"200ms"},"GET /fast":{"deadline":"100ms"},
              "GET /no-deadline":{"criticality":"SHEDDABLE"}}}}}"#,
    )
    .unwrap();
    let found = lint(&cfg.policy);
    let codes: Vec<_> = found.iter().map(|l| (l.path.as_str(), l.code)).collect();
    assert_eq!(
        codes,
        vec![
            ("inbound.routes.GET /fast.deadline", "retry_exceeds_deadline"),
            ("inbound.routes.GET /fast.deadline", "timeout_exceeds_budget"),
            ("inbound.routes.GET /quote/{sku}.deadline", "retry_exceeds_deadline"),
        ]
    );
    assert!(found[0].message.contains("dependencies.p (300ms)"), "{}", found[0].message);
    assert!(found[1].message.contains("dependencies.q (150ms)"), "{}", found[1].message);
    assert!(!found[1].message.contains("dependencies.p"), "{}", found[1].message);
}

/// An inbound route key of no form the inbound layers produce (a raw path, a lower-case
/// method, axum 0.7's `:param`) is accepted but warned about: its deadline and criticality
/// would never apply.
#[test]
fn lint_warns_about_inbound_route_keys_that_can_never_match() {
    let found = lints(
        r#"{"policy":{"inbound":{"routes":{
            "GET /quote/{sku}":{"deadline":"900ms"},
            "/shop.Pricing/Quote":{"deadline":"900ms"},
            "/quote/{sku}":{"deadline":"900ms"},
            "get /quote/{sku}":{"deadline":"900ms"},
            "GET /quote/:sku":{"deadline":"900ms"},
            "GET quote":{"deadline":"900ms"},
            "/health":{"criticality":"SHEDDABLE"}}}}}"#,
    );
    let mut never: Vec<&str> =
        found.iter().filter(|(_, c)| *c == "route_never_matches").map(|(p, _)| p.as_str()).collect();
    never.sort_unstable();
    assert_eq!(
        never,
        vec![
            "inbound.routes./health",
            "inbound.routes./quote/{sku}",
            "inbound.routes.GET /quote/:sku",
            "inbound.routes.GET quote",
            "inbound.routes.get /quote/{sku}",
        ]
    );
}

fn errors(json: &str) -> Vec<FieldError> {
    match check(json) {
        Err(PolicyError::Invalid(v)) => v.0,
        other => panic!("expected validation errors, got {other:?}"),
    }
}

/// OPS-1: a kill switch naming a flag the service does not define (a one-letter typo) is
/// refused, naming the field and the flags that do exist.
#[test]
fn ops_1_kill_switch_naming_no_flag_is_refused_with_the_existing_flags() {
    let errs = errors(
        r#"{"policy": {"dependencies": {"recs": {"enabled_flag": "recommendation.enabled"}},
              "degradation_matrix": [{"feature": "Recommendations", "dependencies": ["recs"],
                                      "on_failure": "generic", "enabled_flag": "recs.feture"}]},
            "flags": {"recommendations.enabled": {"type": "bool", "value": true},
                      "recs.feature": {"type": "bool", "value": true}}}"#,
    );
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        vec!["policy.dependencies.recs.enabled_flag", "policy.degradation_matrix[0].enabled_flag"]
    );
    assert_eq!(errs[0].value, r#""recommendation.enabled""#);
    for e in &errs {
        assert!(e.message.contains(r#"flags: "recommendations.enabled", "recs.feature""#), "{e}");
        assert!(e.message.contains("compiled_in_flags"), "{e}");
    }
    assert!(errs[0].message.contains("dependency recs"), "{}", errs[0]);
    assert!(errs[1].message.contains("feature Recommendations"), "{}", errs[1]);
    // With no flag at all, the message says so.
    let errs = errors(r#"{"policy": {"dependencies": {"recs": {"enabled_flag": "recs.on"}}}}"#);
    assert!(errs[0].message.contains("flags: none"), "{}", errs[0]);
}

#[test]
fn ops_1_kill_switch_must_name_a_bool_flag_or_a_declared_compiled_in_flag() {
    let errs = errors(
        r#"{"policy": {"dependencies": {"recs": {"enabled_flag": "recs.max"}}},
            "flags": {"recs.max": {"type": "int", "value": 5}}}"#,
    );
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].path, "policy.dependencies.recs.enabled_flag");
    assert!(errs[0].message.contains("must name a bool flag"), "{}", errs[0]);

    // Declared as living only in the service's compiled-in defaults: accepted.
    let cfg = check(
        r#"{"policy": {"dependencies": {"recs": {"enabled_flag": "recs.on"}},
                       "compiled_in_flags": ["recs.on"]}}"#,
    )
    .unwrap();
    assert!(cfg.policy.compiled_in_flags.contains("recs.on"));
    assert_eq!(cfg.policy.flag_references()[0].key, "recs.on");
    // A declared key must be a valid flag key, and a typo against it still fails.
    let errs = errors(
        r#"{"policy": {"dependencies": {"recs": {"enabled_flag": "recs.of"}},
                       "compiled_in_flags": ["recs.on", "Bad Key"]}}"#,
    );
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        vec![r#"policy.compiled_in_flags["Bad Key"]"#, "policy.dependencies.recs.enabled_flag"]
    );
    assert!(errs[1].message.contains(r#"compiled_in_flags: "Bad Key", "recs.on""#), "{}", errs[1]);
}

#[test]
fn unknown_dependency_names_list_the_declared_ones() {
    let errs = errors(
        r#"{"policy": {"dependencies": {"pricing": {}, "recs": {}},
              "degradation_matrix": [{"feature": "F", "dependencies": ["pricng"], "on_failure": "generic"}]}}"#,
    );
    assert_eq!(errs[0].path, "policy.degradation_matrix[0].dependencies[0]");
    assert!(errs[0].message.contains(r#"declared: "pricing", "recs""#), "{}", errs[0]);
}

/// An empty `compiled_in_flags` is left out of the canonical JSON, so the snapshots (and
/// hashes) of policies without it are what they were before the field existed.
#[test]
fn empty_compiled_in_flags_is_not_serialized() {
    let cfg = check(r#"{"policy": {"compiled_in_flags": []}}"#).unwrap();
    assert!(!String::from_utf8(canonical_json(&cfg)).unwrap().contains("compiled_in_flags"));
}

/// The operator levers of a snapshot: the expiry is mandatory, each lever is checked with
/// the range of the policy field it replaces (the error names the field and the range), at
/// least one is set, and a snapshot without levers serializes as it did before they
/// existed (same hash).
#[test]
fn levers_need_an_expiry_and_are_checked_with_their_ranges() {
    let err = check(r#"{"levers": {"retries_paused": true}}"#).unwrap_err();
    assert!(matches!(err, PolicyError::Malformed { .. }), "missing expires_at must not decode: {err}");
    let got: Vec<(String, String, String)> = errors(
        r#"{"levers": {"shed_sheddable_percent": 100.5, "inbound_limit": 100001,
                       "expires_at": "2030-01-01T00:00:00Z"}}"#,
    )
    .into_iter()
    .map(|e| (e.path, e.value, e.message))
    .collect();
    assert_eq!(
        got,
        [
            (
                "levers.shed_sheddable_percent".into(),
                "100.5".into(),
                "must be between 0 and 100 percent".into()
            ),
            ("levers.inbound_limit".into(), "100001".into(), "must be between 1 and 100000".into()),
        ]
    );
    let none = errors(r#"{"levers": {"expires_at": "2030-01-01T00:00:00Z"}}"#);
    assert_eq!(none[0].path, "levers");
    assert!(none[0].message.contains("at least one of"), "{none:?}");
    let ok = check(
        r#"{"levers": {"shed_sheddable_percent": 100, "retries_paused": false, "inbound_limit": 1,
                       "expires_at": "2001-01-01T00:00:00Z"}}"#,
    );
    assert!(ok.is_ok(), "an expired override is valid (simply inactive): {ok:?}");
    let cfg = check("{}").unwrap();
    assert!(!String::from_utf8(canonical_json(&cfg)).unwrap().contains("levers"));
}

/// `Inbound::with_levers`: each lever given replaces the policy's value, the limit becomes
/// fixed, the rest of the policy is kept; no override borrows the policy as it is.
#[test]
fn levers_replace_only_the_policy_values_they_set() {
    let inbound = Inbound { shed_sheddable_percent: 10.0, ..Inbound::default() };
    assert!(matches!(inbound.with_levers(None), std::borrow::Cow::Borrowed(_)));
    let l: LeverOverride =
        serde_json::from_str(r#"{"inbound_limit": 7, "expires_at": "2030-01-01T00:00:00Z"}"#).unwrap();
    let got = inbound.with_levers(Some(&l));
    assert_eq!((got.shed_sheddable_percent, got.retries_paused), (10.0, false));
    assert_eq!((got.limit.algorithm, got.limit.initial_limit), (LimitAlgorithm::Fixed, 7));
    assert_eq!(got.limit.max_limit, inbound.limit.max_limit);
}

/// A value of the wrong type names the allowed range that `validate()` states for the
/// field, and the other bad fields of the document are reported with it.
#[test]
fn wrong_type_names_the_range_and_does_not_hide_other_problems() {
    let err = check(
        r#"{"policy":{"dependencies":{"pricing":{
            "retry":{"max_attempts":-1},
            "bulkhead":{"max_concurrent":2.5},
            "circuit_breaker":{"failure_rate_threshold":0},
            "attempt_timeout":"fast"}}}}"#,
    )
    .unwrap_err();
    let PolicyError::Malformed { path, message, .. } = &err else { panic!("{err:?}") };
    assert_eq!(path, "policy.dependencies.pricing.retry.max_attempts");
    assert!(
        message.starts_with("invalid value: integer `-1`, expected a whole number; must be between 1 and 10"),
        "{message}"
    );
    let all = err.field_errors();
    let by_path = |p: &str| {
        all.iter()
            .find(|e| e.path == format!("policy.dependencies.pricing.{p}"))
            .unwrap_or_else(|| panic!("{p} missing in {all:?}"))
    };
    assert!(
        by_path("bulkhead.max_concurrent").message.contains("expected a whole number; must be between 1 and"),
        "{all:?}"
    );
    assert_eq!(by_path("bulkhead.max_concurrent").value, "2.5");
    assert!(by_path("attempt_timeout").message.contains("\"250ms\""), "{all:?}");
    assert_eq!(by_path("circuit_breaker.failure_rate_threshold").message, "must be a ratio, 0 < x <= 1");
    assert!(by_path("attempt_timeout").message.ends_with("must be between 1ms and 5m"), "{all:?}");
    assert_eq!(all.len(), 4, "{all:?}");
}

/// Without a range from `validate()`, the type's own range is named; paths through flag
/// keys that contain dots and through sequences are followed.
#[test]
fn wrong_type_without_a_stated_range_names_the_type_range() {
    let m =
        recover::explain(&[recover::PathPart::Key("x".into())], "invalid value: integer `-1`, expected u32");
    assert_eq!(m, "invalid value: integer `-1`, expected a whole number from 0 to 4294967295");
    let err = check(r#"{"flags":{"pricing.enabled":{"type":"bool","value":true,"rollout":{"percent":"x"}}},"faults":[{"x":1}]}"#)
        .unwrap_err();
    let all = err.field_errors();
    assert!(all.iter().any(|e| e.path.starts_with("flags.pricing.enabled")), "{all:?}");
}

#[test]
fn fallback_levels_rank_and_read_back_in_their_order() {
    for (i, l) in FallbackLevel::ALL.into_iter().enumerate() {
        assert_eq!(l.rank(), i);
        assert_eq!(FallbackLevel::parse(l.as_str()), Some(l));
    }
    assert!(FallbackLevel::Fresh < FallbackLevel::Generic);
    assert_eq!(FallbackLevel::parse("fresh"), None);
    assert_eq!(FallbackLevel::parse("UNRECOGNIZED"), None);
}
