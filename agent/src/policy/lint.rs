//! Policy lint: warnings (not errors) drawn from the rules of thumb of the source article.

use std::time::Duration;

use serde::Serialize;

use super::model::*;

/// One warning about a valid but risky policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Lint {
    /// Dotted path of the field the warning is about.
    pub path: String,
    /// Short machine-readable code, e.g. `retry_exceeds_deadline`.
    pub code: &'static str,
    /// What is risky and what to do instead.
    pub message: String,
}

fn fmt(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// Worst case of a retried call: attempts × attempt timeout + the largest possible backoff
/// before each retry.
pub fn retry_worst_case(attempt_timeout: Duration, retry: &Retry) -> Duration {
    let attempts = retry.max_attempts.max(1);
    let mut total = attempt_timeout * attempts;
    for n in 0..attempts.saturating_sub(1) {
        let exp = retry.base.saturating_mul(1u32 << n.min(20));
        total += exp.min(retry.cap);
    }
    total
}

/// Lints a policy. Returns warnings in a stable order; an empty list means nothing to say.
pub fn lint(policy: &Policy) -> Vec<Lint> {
    let mut out = Vec::new();
    for (name, dep) in &policy.dependencies {
        let p = format!("dependencies.{name}");
        let worst = retry_worst_case(dep.attempt_timeout, &dep.retry);
        if dep.retry.max_attempts > 1 && worst > policy.default_deadline {
            out.push(Lint {
                path: format!("{p}.retry"),
                code: "retry_exceeds_deadline",
                message: format!(
                    "worst case of the retries ({} = attempts × attempt_timeout + backoff) is longer than \
                     the inbound default_deadline ({}); the last attempts can never be used",
                    fmt(worst),
                    fmt(policy.default_deadline)
                ),
            });
        }
        if dep.attempt_timeout > policy.default_deadline {
            out.push(Lint {
                path: format!("{p}.attempt_timeout"),
                code: "timeout_exceeds_budget",
                message: format!(
                    "attempt_timeout ({}) is longer than the caller's default budget ({})",
                    fmt(dep.attempt_timeout),
                    fmt(policy.default_deadline)
                ),
            });
        }
        if dep.retry.max_attempts > 3 {
            out.push(Lint {
                path: format!("{p}.retry.max_attempts"),
                code: "too_many_attempts",
                message: format!(
                    "{} attempts multiply load on a struggling dependency; 3 or fewer is the usual limit",
                    dep.retry.max_attempts
                ),
            });
        }
        if dep.circuit_breaker.enabled && dep.circuit_breaker.minimum_calls < 5 {
            out.push(Lint {
                path: format!("{p}.circuit_breaker.minimum_calls"),
                code: "breaker_minimum_calls_low",
                message: format!(
                    "minimum_calls {} lets a handful of calls open the breaker; 20 is a common floor",
                    dep.circuit_breaker.minimum_calls
                ),
            });
        }
        if dep.criticality == DependencyCriticality::NonCritical
            && dep.fallback == FallbackLevel::FeatureError
        {
            out.push(Lint {
                path: format!("{p}.fallback"),
                code: "non_critical_without_fallback",
                message: "a non-critical dependency should degrade (stale, generic or empty_marked), \
                          not fail its feature"
                    .to_string(),
            });
        }
        if dep.criticality == DependencyCriticality::NonCritical
            && dep.attempt_timeout > policy.non_critical_cap
        {
            out.push(Lint {
                path: format!("{p}.attempt_timeout"),
                code: "non_critical_timeout_capped",
                message: format!(
                    "attempt_timeout ({}) is above non_critical_cap ({}); the cap wins",
                    fmt(dep.attempt_timeout),
                    fmt(policy.non_critical_cap)
                ),
            });
        }
    }
    out
}
