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
    crate::policy::duration::format(d)
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

/// One place where a call's attempt timeout and retries are set: a dependency, or one of
/// its operations that overrides either.
struct Scope<'a> {
    /// Path of the dependency or operation (`dependencies.p.operations.GET /x`).
    path: String,
    attempt_timeout: Duration,
    retry: &'a Retry,
    /// Whether the scope sets its own retry (an operation may inherit the dependency's).
    own_retry: bool,
}

impl Scope<'_> {
    fn worst_case(&self) -> Duration {
        retry_worst_case(self.attempt_timeout, self.retry)
    }

    /// The field a retry warning points at: the scope's own `retry`, else the attempt
    /// timeout that made the inherited retries too long.
    fn retry_path(&self) -> String {
        if self.own_retry { format!("{}.retry", self.path) } else { format!("{}.attempt_timeout", self.path) }
    }
}

/// Every dependency, then each of its operations that overrides `attempt_timeout` or
/// `retry` (an operation inheriting both would only repeat its dependency's warnings).
fn scopes(policy: &Policy) -> Vec<Scope<'_>> {
    let mut out = Vec::new();
    for (name, dep) in &policy.dependencies {
        let path = format!("dependencies.{name}");
        out.push(Scope {
            path: path.clone(),
            attempt_timeout: dep.attempt_timeout,
            retry: &dep.retry,
            own_retry: true,
        });
        for (op, o) in &dep.operations {
            if o.attempt_timeout.is_none() && o.retry.is_none() {
                continue;
            }
            out.push(Scope {
                path: format!("{path}.operations.{op}"),
                attempt_timeout: o.attempt_timeout.unwrap_or(dep.attempt_timeout),
                retry: o.retry.as_ref().unwrap_or(&dep.retry),
                own_retry: o.retry.is_some(),
            });
        }
    }
    out
}

/// Lints a policy. Returns warnings in a stable order; an empty list means nothing to say.
///
/// The retry and timeout lints read every dependency and every operation override, and
/// compare them with `default_deadline` and with each route's `deadline`
/// (`inbound.routes`): a route's warning lists the dependencies and operations that do not
/// fit its budget, since the policy does not say which of them the route calls.
pub fn lint(policy: &Policy) -> Vec<Lint> {
    let mut out = Vec::new();
    let scopes = scopes(policy);
    for scope in &scopes {
        let worst = scope.worst_case();
        if scope.retry.max_attempts > 1 && worst > policy.default_deadline {
            out.push(Lint {
                path: scope.retry_path(),
                code: "retry_exceeds_deadline",
                message: format!(
                    "worst case of the retries ({} = attempts × attempt_timeout + backoff) is longer than \
                     the inbound default_deadline ({}); the last attempts can never be used",
                    fmt(worst),
                    fmt(policy.default_deadline)
                ),
            });
        }
        if scope.attempt_timeout > policy.default_deadline {
            out.push(Lint {
                path: format!("{}.attempt_timeout", scope.path),
                code: "timeout_exceeds_budget",
                message: format!(
                    "attempt_timeout ({}) is longer than the caller's default budget ({})",
                    fmt(scope.attempt_timeout),
                    fmt(policy.default_deadline)
                ),
            });
        }
        if scope.own_retry && scope.retry.max_attempts > 3 {
            out.push(Lint {
                path: format!("{}.retry.max_attempts", scope.path),
                code: "too_many_attempts",
                message: format!(
                    "{} attempts multiply load on a struggling dependency; 3 or fewer is the usual limit",
                    scope.retry.max_attempts
                ),
            });
        }
    }
    for (name, dep) in &policy.dependencies {
        let p = format!("dependencies.{name}");
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
    for route in policy.inbound.routes.keys() {
        if let Some(why) = route_never_matches(route) {
            out.push(Lint {
                path: format!("inbound.routes.{route}"),
                code: "route_never_matches",
                message: format!(
                    "{route:?} can never match a request: {why}. Inbound routes are named \
                     \"METHOD template\" for HTTP (\"GET /quote/{{sku}}\", the template the router \
                     matched) or by the gRPC method path (\"/shop.Pricing/Quote\"); never by a raw path"
                ),
            });
        }
    }
    for (route, r) in &policy.inbound.routes {
        let Some(deadline) = r.deadline else { continue };
        let path = format!("inbound.routes.{route}.deadline");
        let list = |items: Vec<String>| items.join(", ");
        let too_long: Vec<String> = scopes
            .iter()
            .filter(|s| s.retry.max_attempts > 1 && s.worst_case() > deadline)
            .map(|s| format!("{} ({})", s.path, fmt(s.worst_case())))
            .collect();
        if !too_long.is_empty() {
            out.push(Lint {
                path: path.clone(),
                code: "retry_exceeds_deadline",
                message: format!(
                    "the route's deadline ({}) is shorter than the worst case of the retries of {}; \
                     if the route calls them, their last attempts can never be used",
                    fmt(deadline),
                    list(too_long)
                ),
            });
        }
        let too_slow: Vec<String> = scopes
            .iter()
            .filter(|s| s.attempt_timeout > deadline)
            .map(|s| format!("{} ({})", s.path, fmt(s.attempt_timeout)))
            .collect();
        if !too_slow.is_empty() {
            out.push(Lint {
                path,
                code: "timeout_exceeds_budget",
                message: format!(
                    "the route's deadline ({}) is shorter than the attempt_timeout of {}; if the route \
                     calls them, one slow attempt uses its whole budget",
                    fmt(deadline),
                    list(too_slow)
                ),
            });
        }
    }
    out
}

/// Why an inbound route key is of no form the inbound layers produce (see
/// `admission::route_key`): `"METHOD /template"` with an upper-case method, or a gRPC
/// method path `/package.Service/Method`. `None` when it can match.
pub fn route_never_matches(key: &str) -> Option<&'static str> {
    if let Some((method, template)) = key.split_once(' ') {
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
            return Some("the method must be upper case, as requests carry it (\"GET\", \"POST\", …)");
        }
        if !template.starts_with('/') {
            return Some("the template after the method must start with '/'");
        }
        if template.contains(' ') {
            return Some("method and template are separated by exactly one space");
        }
        if template.split('/').any(|seg| seg.starts_with(':')) {
            return Some("`:name` is not a path parameter; templates write parameters as `{name}`");
        }
        return None;
    }
    // Without a method, only a gRPC method path can match.
    let grpc =
        key.strip_prefix('/').and_then(|rest| rest.split_once('/')).is_some_and(|(service, method)| {
            !service.is_empty()
                && !method.is_empty()
                && !method.contains('/')
                && !service.contains(['{', '}'])
                && !method.contains(['{', '}'])
        });
    if grpc {
        None
    } else {
        Some("without a method it must be a gRPC method path; prefix HTTP routes with their method")
    }
}
