//! Validation of the policy model: every bad field is reported at once, with its path,
//! the bad value and what is allowed. The server runs it before storing; the agent runs it
//! before applying a pushed or cached snapshot.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use serde::Serialize;

use super::defaults as d;
use super::model::*;

/// One bad field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FieldError {
    /// Dotted path of the field, e.g. `policy.dependencies.pricing.retry.max_attempts`.
    pub path: String,
    /// The bad value as written (JSON), or empty when the field is missing.
    pub value: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}: {}", self.path, self.message)
        } else {
            write!(f, "{}: {} (got {})", self.path, self.message, self.value)
        }
    }
}

/// Every bad field of one document. Never empty.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Collects field errors while walking a document.
#[derive(Debug, Default)]
struct Check {
    errors: Vec<FieldError>,
}

fn ms(d: Duration) -> String {
    crate::policy::duration::format(d)
}

impl Check {
    fn push(&mut self, path: impl Into<String>, value: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError { path: path.into(), value: value.into(), message: message.into() });
    }

    fn range_u32(&mut self, path: &str, v: u32, lo: u32, hi: u32) {
        if v < lo || v > hi {
            self.push(path, v.to_string(), format!("must be between {lo} and {hi}"));
        }
    }

    fn ratio(&mut self, path: &str, v: f64, allow_zero: bool) {
        let ok = v.is_finite() && v <= 1.0 && (if allow_zero { v >= 0.0 } else { v > 0.0 });
        if !ok {
            let lo = if allow_zero { "0 <= x" } else { "0 < x" };
            self.push(path, v.to_string(), format!("must be a ratio, {lo} <= 1"));
        }
    }

    fn range_f64(&mut self, path: &str, v: f64, lo: f64, hi: f64, unit: &str) {
        if !v.is_finite() || v < lo || v > hi {
            self.push(path, v.to_string(), format!("must be between {lo} and {hi}{unit}"));
        }
    }

    fn duration(&mut self, path: &str, v: Duration, lo: Duration, hi: Duration) {
        if v < lo || v > hi {
            self.push(path, format!("{:?}", ms(v)), format!("must be between {} and {}", ms(lo), ms(hi)));
        }
    }

    fn name(&mut self, path: &str, v: &str, what: &str) {
        if let Err(msg) = check_name(v) {
            self.push(path, format!("{v:?}"), format!("{what} {msg}"));
        }
    }

    fn text(&mut self, path: &str, v: &str, max: usize) {
        if v.len() > max {
            self.push(path, format!("{} bytes", v.len()), format!("must be at most {max} bytes"));
        }
        if v.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
            self.push(path, format!("{v:?}"), "must not contain control characters");
        }
    }

    fn count(&mut self, path: &str, n: usize, max: usize) {
        if n > max {
            self.push(path, format!("{n} entries"), format!("must have at most {max} entries"));
        }
    }
}

/// Checks a name of a dependency, operation-less identifier, flag key, environment or service:
/// 1..=64 bytes of `a-z 0-9 . _ -`, starting with a letter or digit.
pub fn check_name(v: &str) -> Result<(), &'static str> {
    if v.is_empty() || v.len() > 64 {
        return Err("must be 1 to 64 characters long");
    }
    let first_ok = v.as_bytes()[0].is_ascii_lowercase() || v.as_bytes()[0].is_ascii_digit();
    let all_ok = v.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if !first_ok || !all_ok {
        return Err("must use only a-z, 0-9, '.', '_' and '-', starting with a letter or digit");
    }
    Ok(())
}

/// Checks an operation name (a route template such as `GET /users/{id}` or a gRPC method
/// such as `/shop.Pricing/Quote`): 1..=128 printable ASCII characters, no raw query string.
pub fn check_operation(v: &str) -> Result<(), &'static str> {
    if v.is_empty() || v.len() > 128 {
        return Err("must be 1 to 128 characters long");
    }
    if !v.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err("must be printable ASCII");
    }
    if v.contains('?') {
        return Err("must be a route template without a query string");
    }
    Ok(())
}

/// Names for a message: `"a", "b"` (at most 20, then how many more), or `none`.
fn names<'a>(all: impl IntoIterator<Item = &'a str>) -> String {
    const SHOWN: usize = 20;
    let all: Vec<&str> = all.into_iter().collect();
    if all.is_empty() {
        return "none".into();
    }
    let mut out = all.iter().take(SHOWN).map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ");
    if all.len() > SHOWN {
        out.push_str(&format!(" and {} more", all.len() - SHOWN));
    }
    out
}

/// The message for a name that is not among `known` (`what`: "dependency", …).
fn unknown(what: &str, known: String) -> String {
    format!("must name a {what} declared in the policy; declared: {known}")
}

const MAX_TIMEOUT: Duration = Duration::from_secs(300);
/// The shortest attempt timeout Levee allows (dependency and operation `attempt_timeout`).
pub const MIN_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1);
/// Allowed inbound concurrency limits (`limit.*_limit`, the `inbound_limit` lever).
const LIMIT_RANGE: (u32, u32) = (1, 100_000);
/// Allowed share of sheddable traffic shed by the operator lever, in percent.
const SHED_PERCENT_RANGE: (f64, f64) = (0.0, 100.0);
const MAX_DEADLINE_ALLOWED: Duration = Duration::from_secs(3600);

impl ServiceConfig {
    /// Validates the whole configuration.
    ///
    /// Returns every bad field at once (`ValidationErrors`), each naming its path (prefixed
    /// `policy.`, `flags.<key>`, `faults[i]`, `breaker_overrides[i]`, `levers.`), the value and the
    /// allowed range. Expired fault rules and overrides are valid (they are simply inactive).
    ///
    /// Only here, where the flags are visible, is each kill switch of the policy
    /// (`enabled_flag` of a dependency or a degradation-matrix row) checked against them
    /// (OPS-1): it must name a bool flag of `flags`, or a key the policy lists in
    /// `compiled_in_flags`; the error names the flags that do exist.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut c = Check::default();
        validate_policy(&mut c, "policy", &self.policy);
        validate_flags(&mut c, &self.flags);
        validate_flag_references(&mut c, self);
        validate_faults(&mut c, &self.faults, &self.policy);
        validate_overrides(&mut c, &self.breaker_overrides, &self.policy);
        if let Some(l) = &self.levers {
            validate_levers(&mut c, "levers", l);
        }
        if c.errors.is_empty() { Ok(()) } else { Err(ValidationErrors(c.errors)) }
    }
}

impl Policy {
    /// Validates a policy alone (what `PUT .../policy` takes); paths are relative to it.
    /// Kill-switch references to flags are checked by [`ServiceConfig::validate`], which
    /// sees the flags.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut c = Check::default();
        validate_policy(&mut c, "", self);
        if c.errors.is_empty() { Ok(()) } else { Err(ValidationErrors(c.errors)) }
    }
}

impl Flag {
    /// Validates one flag; paths are relative to it.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut c = Check::default();
        validate_flag(&mut c, "", self);
        if c.errors.is_empty() { Ok(()) } else { Err(ValidationErrors(c.errors)) }
    }
}

fn join(prefix: &str, field: &str) -> String {
    if prefix.is_empty() { field.to_string() } else { format!("{prefix}.{field}") }
}

fn validate_policy(c: &mut Check, p: &str, policy: &Policy) {
    let ms1 = Duration::from_millis(1);
    c.duration(&join(p, "default_deadline"), policy.default_deadline, ms1, MAX_DEADLINE_ALLOWED);
    c.duration(&join(p, "max_deadline"), policy.max_deadline, ms1, MAX_DEADLINE_ALLOWED);
    if policy.default_deadline > policy.max_deadline {
        c.push(
            join(p, "default_deadline"),
            format!("{:?}", ms(policy.default_deadline)),
            format!("must not exceed max_deadline ({})", ms(policy.max_deadline)),
        );
    }
    c.duration(&join(p, "reserve"), policy.reserve, Duration::ZERO, Duration::from_secs(10));
    if policy.reserve >= policy.default_deadline {
        c.push(
            join(p, "reserve"),
            format!("{:?}", ms(policy.reserve)),
            format!("must be shorter than default_deadline ({})", ms(policy.default_deadline)),
        );
    }
    c.duration(&join(p, "non_critical_cap"), policy.non_critical_cap, ms1, MAX_TIMEOUT);
    c.count(&join(p, "dependencies"), policy.dependencies.len(), d::MAX_DEPENDENCIES);
    for (name, dep) in &policy.dependencies {
        let dp = format!("{}.{name}", join(p, "dependencies"));
        c.name(&dp, name, "dependency name");
        validate_dependency(c, &dp, dep);
    }
    validate_inbound(c, &join(p, "inbound"), &policy.inbound);
    validate_client_throttle(c, &join(p, "client_throttle"), &policy.client_throttle);
    c.count(&join(p, "degradation_matrix"), policy.degradation_matrix.len(), d::MAX_MATRIX_ROWS);
    let mut features = BTreeSet::new();
    for (i, row) in policy.degradation_matrix.iter().enumerate() {
        let rp = format!("{}[{i}]", join(p, "degradation_matrix"));
        if row.feature.trim().is_empty() {
            c.push(join(&rp, "feature"), "\"\"", "must name the feature");
        }
        c.text(&join(&rp, "feature"), &row.feature, 200);
        if !features.insert(row.feature.as_str()) {
            c.push(join(&rp, "feature"), format!("{:?}", row.feature), "must be unique in the matrix");
        }
        if row.dependencies.is_empty() {
            c.push(join(&rp, "dependencies"), "[]", "must name at least one dependency");
        }
        for (j, dep) in row.dependencies.iter().enumerate() {
            if !policy.dependencies.contains_key(dep) {
                c.push(
                    format!("{}[{j}]", join(&rp, "dependencies")),
                    format!("{dep:?}"),
                    unknown("dependency", names(policy.dependencies.keys().map(String::as_str))),
                );
            }
        }
        if row.on_failure == FallbackLevel::Fresh {
            c.push(
                join(&rp, "on_failure"),
                "\"fresh\"",
                "must be a fallback level: stale, generic, empty_marked or feature_error",
            );
        }
        c.text(&join(&rp, "owner"), &row.owner, 200);
        c.text(&join(&rp, "decision"), &row.decision, 500);
        c.text(&join(&rp, "runbook"), &row.runbook, 500);
        c.duration(
            &join(&rp, "alert_after"),
            row.alert_after,
            Duration::from_secs(1),
            Duration::from_secs(30 * 86400),
        );
        if let Some(f) = &row.enabled_flag {
            c.name(&join(&rp, "enabled_flag"), f, "flag key");
        }
    }
    let cp = join(p, "compiled_in_flags");
    c.count(&cp, policy.compiled_in_flags.len(), d::MAX_FLAGS);
    for key in &policy.compiled_in_flags {
        c.name(&format!("{cp}[{key:?}]"), key, "flag key");
    }
}

/// OPS-1: every kill switch names a bool flag of the service, or one the policy declares as
/// living only in the service's compiled-in defaults.
fn validate_flag_references(c: &mut Check, cfg: &ServiceConfig) {
    for r in cfg.policy.flag_references() {
        let path = format!("policy.{}", r.path);
        match cfg.flags.get(r.key) {
            Some(f) if f.kind == FlagType::Bool => {}
            Some(f) => c.push(
                path,
                format!("{:?}", r.key),
                format!(
                    "must name a bool flag: this kill switch of {} names a {} flag",
                    r.switches,
                    f.kind.as_str()
                ),
            ),
            None if cfg.policy.compiled_in_flags.contains(r.key) => {}
            None => c.push(
                path,
                format!("{:?}", r.key),
                format!(
                    "must name a flag of this service, or a key listed in policy.compiled_in_flags when only \
                     the service's compiled-in defaults define it (the kill switch of {} would otherwise do \
                     nothing); flags: {}; compiled_in_flags: {}",
                    r.switches,
                    names(cfg.flags.keys().map(String::as_str)),
                    names(cfg.policy.compiled_in_flags.iter().map(String::as_str)),
                ),
            ),
        }
    }
}

fn validate_dependency(c: &mut Check, p: &str, dep: &DependencyPolicy) {
    if let Some(f) = &dep.enabled_flag {
        c.name(&join(p, "enabled_flag"), f, "flag key");
    }
    c.duration(&join(p, "attempt_timeout"), dep.attempt_timeout, MIN_ATTEMPT_TIMEOUT, MAX_TIMEOUT);
    validate_retry(c, &join(p, "retry"), &dep.retry);
    validate_breaker(c, &join(p, "circuit_breaker"), &dep.circuit_breaker);
    validate_bulkhead(c, &join(p, "bulkhead"), &dep.bulkhead);
    if dep.fallback == FallbackLevel::Fresh {
        c.push(
            join(p, "fallback"),
            "\"fresh\"",
            "must be a fallback level: stale, generic, empty_marked or feature_error",
        );
    }
    c.duration(
        &join(p, "stale_max_age"),
        dep.stale_max_age,
        Duration::from_secs(1),
        Duration::from_secs(7 * 86400),
    );
    c.duration(
        &join(p, "fallback_timeout"),
        dep.fallback_timeout,
        Duration::from_millis(1),
        Duration::from_secs(10),
    );
    if let Some(od) = &dep.outlier_detection {
        let op = join(p, "outlier_detection");
        c.range_u32(&join(&op, "consecutive_errors"), od.consecutive_errors, 1, 1000);
        c.duration(
            &join(&op, "interval"),
            od.interval,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        );
        c.duration(
            &join(&op, "base_ejection_time"),
            od.base_ejection_time,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        );
        c.range_u32(&join(&op, "max_ejection_percent"), od.max_ejection_percent, 0, 100);
    }
    c.count(&join(p, "operations"), dep.operations.len(), d::MAX_OPERATIONS);
    for (name, op) in &dep.operations {
        let opp = format!("{}.{name}", join(p, "operations"));
        if let Err(msg) = check_operation(name) {
            c.push(&opp, format!("{name:?}"), format!("operation name {msg}"));
        }
        if let Some(t) = op.attempt_timeout {
            c.duration(&join(&opp, "attempt_timeout"), t, MIN_ATTEMPT_TIMEOUT, MAX_TIMEOUT);
        }
        if let Some(r) = &op.retry {
            validate_retry(c, &join(&opp, "retry"), r);
        }
        if let Some(b) = &op.circuit_breaker {
            validate_breaker(c, &join(&opp, "circuit_breaker"), b);
        }
        if let Some(b) = &op.bulkhead {
            validate_bulkhead(c, &join(&opp, "bulkhead"), b);
        }
    }
}

fn validate_retry(c: &mut Check, p: &str, r: &Retry) {
    c.range_u32(&join(p, "max_attempts"), r.max_attempts, 1, 10);
    c.duration(&join(p, "base"), r.base, Duration::from_millis(1), Duration::from_secs(60));
    c.duration(&join(p, "cap"), r.cap, Duration::from_millis(1), Duration::from_secs(300));
    if r.cap < r.base {
        c.push(join(p, "cap"), format!("{:?}", ms(r.cap)), format!("must be at least base ({})", ms(r.base)));
    }
    let bp = join(p, "budget");
    c.ratio(&join(&bp, "ratio"), r.budget.ratio, true);
    c.range_f64(&join(&bp, "capacity"), r.budget.capacity, 1.0, 10_000.0, " tokens");
    c.range_f64(&join(&bp, "min_retries_per_sec"), r.budget.min_retries_per_sec, 0.0, 1000.0, " per second");
}

fn validate_breaker(c: &mut Check, p: &str, b: &CircuitBreakerPolicy) {
    match b.window {
        Window::Count { size } => c.range_u32(&join(p, "window.size"), size, 1, 10_000),
        Window::Time { seconds } => c.range_u32(&join(p, "window.seconds"), seconds, 1, 3600),
    }
    c.range_u32(&join(p, "minimum_calls"), b.minimum_calls, 1, 10_000);
    if let Window::Count { size } = b.window
        && b.minimum_calls > size
    {
        c.push(
            join(p, "minimum_calls"),
            b.minimum_calls.to_string(),
            format!("must not exceed the count window size ({size}), or the breaker could never trip"),
        );
    }
    c.ratio(&join(p, "failure_rate_threshold"), b.failure_rate_threshold, false);
    c.ratio(&join(p, "slow_call_rate_threshold"), b.slow_call_rate_threshold, false);
    if let Some(s) = b.slow_call_duration {
        c.duration(&join(p, "slow_call_duration"), s, Duration::from_millis(1), MAX_TIMEOUT);
    }
    c.duration(
        &join(p, "wait_in_open"),
        b.wait_in_open,
        Duration::from_millis(10),
        Duration::from_secs(3600),
    );
    c.duration(
        &join(p, "max_wait_in_open"),
        b.max_wait_in_open,
        Duration::from_millis(10),
        Duration::from_secs(86400),
    );
    if b.max_wait_in_open < b.wait_in_open {
        c.push(
            join(p, "max_wait_in_open"),
            format!("{:?}", ms(b.max_wait_in_open)),
            format!("must be at least wait_in_open ({})", ms(b.wait_in_open)),
        );
    }
    c.range_u32(&join(p, "half_open_probes"), b.half_open_probes, 1, 100);
    if let Some(w) = b.max_wait_in_half_open {
        c.duration(&join(p, "max_wait_in_half_open"), w, Duration::from_millis(1), Duration::from_secs(3600));
    }
}

fn validate_bulkhead(c: &mut Check, p: &str, b: &BulkheadPolicy) {
    c.range_u32(&join(p, "max_concurrent"), b.max_concurrent, 1, 100_000);
    c.duration(&join(p, "max_wait"), b.max_wait, Duration::ZERO, Duration::from_secs(60));
}

fn validate_inbound(c: &mut Check, p: &str, i: &Inbound) {
    let lp = join(p, "limit");
    let l = &i.limit;
    let (lo, hi) = LIMIT_RANGE;
    c.range_u32(&join(&lp, "initial_limit"), l.initial_limit, lo, hi);
    c.range_u32(&join(&lp, "min_limit"), l.min_limit, lo, hi);
    c.range_u32(&join(&lp, "max_limit"), l.max_limit, lo, hi);
    if l.max_limit < l.min_limit {
        c.push(
            join(&lp, "max_limit"),
            l.max_limit.to_string(),
            format!("must be at least min_limit ({})", l.min_limit),
        );
    }
    if l.algorithm != LimitAlgorithm::Fixed
        && (l.initial_limit < l.min_limit || l.initial_limit > l.max_limit)
    {
        c.push(
            join(&lp, "initial_limit"),
            l.initial_limit.to_string(),
            format!("must be between min_limit ({}) and max_limit ({})", l.min_limit, l.max_limit),
        );
    }
    if !(l.backoff_ratio.is_finite() && l.backoff_ratio >= 0.5 && l.backoff_ratio < 1.0) {
        c.push(join(&lp, "backoff_ratio"), l.backoff_ratio.to_string(), "must be a ratio, 0.5 <= x < 1");
    }
    c.duration(&join(&lp, "timeout"), l.timeout, Duration::from_millis(1), MAX_TIMEOUT);
    if let Some(smoothing) = l.smoothing {
        c.ratio(&join(&lp, "smoothing"), smoothing, false);
    }
    c.range_u32(&join(&lp, "long_window"), l.long_window, 1, 100_000);
    c.range_f64(&join(&lp, "rtt_tolerance"), l.rtt_tolerance, 1.0, 10.0, "");
    c.range_u32(&join(&lp, "queue_size"), l.queue_size, 0, 10_000);
    let qp = join(p, "queue");
    c.range_u32(&join(&qp, "max_len"), i.queue.max_len, 0, 100_000);
    c.duration(
        &join(&qp, "codel_target"),
        i.queue.codel_target,
        Duration::from_millis(1),
        Duration::from_secs(10),
    );
    c.duration(
        &join(&qp, "codel_interval"),
        i.queue.codel_interval,
        Duration::from_millis(1),
        Duration::from_secs(60),
    );
    if i.queue.codel_interval < i.queue.codel_target {
        c.push(
            join(&qp, "codel_interval"),
            format!("{:?}", ms(i.queue.codel_interval)),
            format!("must be at least codel_target ({})", ms(i.queue.codel_target)),
        );
    }
    c.count(&join(p, "routes"), i.routes.len(), d::MAX_ROUTES);
    for (name, route) in &i.routes {
        let rp = format!("{}.{name}", join(p, "routes"));
        if let Err(msg) = check_operation(name) {
            c.push(&rp, format!("{name:?}"), format!("route template {msg}"));
        }
        if let Some(dl) = route.deadline {
            c.duration(&join(&rp, "deadline"), dl, Duration::from_millis(1), MAX_DEADLINE_ALLOWED);
        }
    }
    let (lo, hi) = SHED_PERCENT_RANGE;
    c.range_f64(&join(p, "shed_sheddable_percent"), i.shed_sheddable_percent, lo, hi, " percent");
    if let Some(f) = &i.read_only_flag {
        c.name(&join(p, "read_only_flag"), f, "flag key");
    }
}

fn validate_client_throttle(c: &mut Check, p: &str, t: &ClientThrottle) {
    c.range_f64(&join(p, "k"), t.k, 1.0, 10.0, "");
    c.duration(&join(p, "window"), t.window, Duration::from_secs(1), Duration::from_secs(3600));
}

fn validate_flags(c: &mut Check, flags: &std::collections::BTreeMap<String, Flag>) {
    c.count("flags", flags.len(), d::MAX_FLAGS);
    for (key, flag) in flags {
        let fp = format!("flags.{key}");
        c.name(&fp, key, "flag key");
        validate_flag(c, &fp, flag);
    }
}

impl FlagType {
    /// `Ok` when `value` is a value of this type ([`accepts`](Self::accepts)); otherwise the
    /// error at `path`, with the value as written (cut at 80 bytes) and the type it must have.
    /// The one check of a flag's value against its type, for every write that sets one.
    pub fn check(self, path: &str, value: &serde_json::Value) -> Result<(), FieldError> {
        if self.accepts(value) {
            return Ok(());
        }
        Err(FieldError {
            path: path.to_string(),
            value: truncate(&value.to_string(), 80),
            message: format!(
                "must be {} {} value, as the flag's type says",
                if self == FlagType::Int { "an" } else { "a" },
                self.as_str()
            ),
        })
    }
}

fn validate_flag(c: &mut Check, p: &str, flag: &Flag) {
    if let Err(e) = flag.kind.check(&join(p, "value"), &flag.value) {
        c.errors.push(e);
    }
    let size = flag.value.to_string().len();
    if size > d::MAX_FLAG_VALUE_BYTES {
        c.push(
            join(p, "value"),
            format!("{size} bytes"),
            format!("must be at most {} bytes", d::MAX_FLAG_VALUE_BYTES),
        );
    }
    let depth = value_depth(&flag.value);
    if depth > d::MAX_FLAG_VALUE_DEPTH {
        c.push(
            join(p, "value"),
            format!("{depth} levels"),
            format!("must nest arrays and objects at most {} levels deep", d::MAX_FLAG_VALUE_DEPTH),
        );
    }
    c.text(&join(p, "description"), &flag.description, 1000);
    c.text(&join(p, "owner"), &flag.owner, 200);
    if let StalePolicy::RevertAfter(t) = flag.stale {
        c.duration(
            &join(p, "stale.revert_after"),
            t,
            Duration::from_secs(1),
            Duration::from_secs(365 * 86400),
        );
    }
    if let Some(r) = &flag.rollout {
        c.range_f64(&join(p, "rollout.percent"), r.percent, 0.0, 100.0, " percent");
        if flag.kind != FlagType::Bool {
            c.push(join(p, "rollout"), "", "is only supported for bool flags");
        }
    }
}

/// How deep arrays and objects nest in `v`: 0 for a scalar, 1 for `[1]` or `{}`. Walks
/// with a stack of its own, so a value built deeper than any decoder allows is measured
/// too.
fn value_depth(v: &serde_json::Value) -> usize {
    use serde_json::Value;
    let mut deepest = 0;
    let mut todo = vec![(v, 0usize)];
    while let Some((v, depth)) = todo.pop() {
        match v {
            Value::Array(items) => {
                deepest = deepest.max(depth + 1);
                todo.extend(items.iter().map(|i| (i, depth + 1)));
            }
            Value::Object(members) => {
                deepest = deepest.max(depth + 1);
                todo.extend(members.values().map(|m| (m, depth + 1)));
            }
            _ => deepest = deepest.max(depth),
        }
    }
    deepest
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn validate_faults(c: &mut Check, faults: &[FaultRule], policy: &Policy) {
    c.count("faults", faults.len(), d::MAX_FAULTS);
    let mut ids = BTreeSet::new();
    for (i, f) in faults.iter().enumerate() {
        let fp = format!("faults[{i}]");
        c.name(&join(&fp, "id"), &f.id, "fault id");
        if !ids.insert(f.id.as_str()) {
            c.push(join(&fp, "id"), format!("{:?}", f.id), "must be unique");
        }
        validate_target(c, &fp, &f.dependency, f.operation.as_deref(), policy);
        c.range_f64(&join(&fp, "percent"), f.percent, 0.0, 100.0, " percent");
        c.count(&join(&fp, "instances"), f.instances.len(), d::MAX_FAULT_INSTANCES);
        for (j, id) in f.instances.iter().enumerate() {
            if id.is_empty()
                || id.len() > d::MAX_INSTANCE_ID_BYTES
                || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:@/-".contains(&b))
            {
                c.push(
                    format!("{fp}.instances[{j}]"),
                    format!("{id:?}"),
                    format!(
                        "must be an instance id: 1..={} bytes of A-Z a-z 0-9 . _ : @ / -",
                        d::MAX_INSTANCE_ID_BYTES
                    ),
                );
            }
        }
        match &f.action {
            FaultAction::Delay { delay } => {
                c.duration(&join(&fp, "action.delay"), *delay, Duration::from_millis(1), MAX_TIMEOUT)
            }
            FaultAction::Abort { status } => {
                if !(400..=599).contains(status) {
                    c.push(
                        join(&fp, "action.status"),
                        status.to_string(),
                        "must be an HTTP error status, 400..=599",
                    );
                }
            }
            FaultAction::ConnectionError => {}
        }
    }
}

fn validate_target(c: &mut Check, p: &str, dep: &str, op: Option<&str>, policy: &Policy) {
    match policy.dependencies.get(dep) {
        None => c.push(
            join(p, "dependency"),
            format!("{dep:?}"),
            unknown("dependency", names(policy.dependencies.keys().map(String::as_str))),
        ),
        Some(d) => {
            if let Some(op) = op
                && !d.operations.contains_key(op)
            {
                c.push(
                    join(p, "operation"),
                    format!("{op:?}"),
                    format!(
                        "must name an operation declared for that dependency, or be omitted; declared: {}",
                        names(d.operations.keys().map(String::as_str))
                    ),
                );
            }
        }
    }
}

/// The lever override: the same ranges as the policy levers it replaces. An expired one
/// is valid (simply inactive).
fn validate_levers(c: &mut Check, p: &str, l: &LeverOverride) {
    if l.shed_sheddable_percent.is_none() && l.retries_paused.is_none() && l.inbound_limit.is_none() {
        c.push(p, "", "must set at least one of shed_sheddable_percent, retries_paused, inbound_limit");
    }
    if let Some(v) = l.shed_sheddable_percent {
        let (lo, hi) = SHED_PERCENT_RANGE;
        c.range_f64(&join(p, "shed_sheddable_percent"), v, lo, hi, " percent");
    }
    if let Some(n) = l.inbound_limit {
        let (lo, hi) = LIMIT_RANGE;
        c.range_u32(&join(p, "inbound_limit"), n, lo, hi);
    }
    c.text(&join(p, "reason"), &l.reason, 1000);
}

fn validate_overrides(c: &mut Check, overrides: &[BreakerOverride], policy: &Policy) {
    c.count("breaker_overrides", overrides.len(), d::MAX_BREAKER_OVERRIDES);
    let mut seen = BTreeSet::new();
    for (i, o) in overrides.iter().enumerate() {
        let op = format!("breaker_overrides[{i}]");
        validate_target(c, &op, &o.dependency, o.operation.as_deref(), policy);
        if !seen.insert((o.dependency.as_str(), o.operation.as_deref())) {
            c.push(&op, format!("{:?}", o.dependency), "only one override per breaker");
        }
        c.text(&join(&op, "reason"), &o.reason, 1000);
    }
}
