//! The public handle on one outgoing dependency: its calls (plain, judged, with a
//! fallback, stale-if-error, balanced over endpoints) and what it tells about its policy
//! and guards, each through one load of the dependency's view.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::view::DepView;
use super::{CallError, DependencyLayer, Judgement, run};
use crate::breaker::BreakerSnapshot;
use crate::policy::{self, FallbackLevel};
use crate::retry::Classify;

/// A handle on one outgoing dependency. Cheap to clone; every call reads the dependency's
/// current policy with one lock-free load.
///
/// An unknown dependency (named neither in the applied snapshot nor in the compiled-in
/// defaults) is enforced with [`policy::DependencyPolicy::default()`].
#[derive(Clone)]
pub struct Dependency {
    name: Arc<str>,
    slot: Arc<ArcSwap<DepView>>,
}

impl fmt::Debug for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dependency").field("name", &self.name).field("enabled", &self.is_enabled()).finish()
    }
}

impl Dependency {
    /// The handle of the view in `slot` (made by the registry of views).
    pub(super) fn new(name: Arc<str>, slot: Arc<ArcSwap<DepView>>) -> Dependency {
        Dependency { name, slot }
    }

    /// The name the dependency is tracked under: the one asked for, or
    /// [`OVERFLOW_DEPENDENCY`](super::OVERFLOW_DEPENDENCY) past
    /// [`MAX_TRACKED_DEPENDENCIES`](super::MAX_TRACKED_DEPENDENCIES).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The dependency's current policy (from the applied snapshot, else the compiled-in
    /// defaults, else [`policy::DependencyPolicy::default()`]).
    pub fn policy(&self) -> Arc<policy::DependencyPolicy> {
        self.slot.load().policy.clone()
    }

    /// Whether the kill switch currently lets calls through: the `enabled_flag`'s value
    /// (server value, else the declared default of a handle with that key, else `true`);
    /// `true` without an `enabled_flag`.
    pub fn is_enabled(&self) -> bool {
        self.slot.load().enabled
    }

    /// The configured per-attempt timeout of `operation`: the operation's override, else
    /// the dependency's (before deadline, reserve and non-critical cap are applied).
    pub fn attempt_timeout(&self, operation: &str) -> Duration {
        self.slot.load().scope(operation).attempt_timeout
    }

    /// A point-in-time view of the circuit breaker of `operation`'s scope (the
    /// dependency's unless the operation has its own breaker).
    pub fn breaker(&self, operation: &str) -> BreakerSnapshot {
        self.slot.load().scope(operation).guards.breaker.snapshot()
    }

    /// Calls in flight in the bulkhead of `operation`'s scope, and its current size.
    pub fn bulkhead_usage(&self, operation: &str) -> (u32, u32) {
        let view = self.slot.load();
        let b = &view.scope(operation).guards.bulkhead;
        (b.in_flight(), b.max_concurrent())
    }

    /// Little's-law size suggestion of the bulkhead of `operation`'s scope.
    pub fn bulkhead_estimate(&self, operation: &str) -> crate::bulkhead::LittleEstimate {
        self.slot.load().scope(operation).guards.bulkhead.estimate()
    }

    /// Tokens left in the retry budget of `operation`'s scope.
    pub fn retry_budget_tokens(&self, operation: &str) -> f64 {
        self.slot.load().scope(operation).guards.retrier.budget().tokens()
    }

    /// Whether a call of `operation` would be retried on failure now (idempotent by name
    /// or policy, more than one attempt configured, retries not paused). Services using
    /// [`call`](Self::call) with their own HTTP client pass this to
    /// [`propagate`](super::propagate) so the service called does not retry again.
    pub fn will_retry(&self, operation: &str) -> bool {
        self.slot.load().will_retry(operation, None)
    }

    pub(crate) fn view(&self) -> Arc<DepView> {
        self.slot.load_full()
    }

    /// Calls the dependency under its whole policy, in the order fixed by the enforcement
    /// function (see the crate docs, `# Order`): kill switch → deadline → bulkhead → retry
    /// → client-side throttle → circuit breaker → per-attempt timeout → `attempt()`.
    ///
    /// Inputs: `operation` (a route template or method name such as
    /// `"GET /recommendations/{user}"`; selects per-operation overrides and decides
    /// idempotency by its HTTP method unless the policy says otherwise), and `attempt`,
    /// which makes the future of one attempt and is called again for each retry. Errors are
    /// classified by their [`Classify`] implementation (retryable? a dependency failure?).
    /// The deadline comes from the task's request context
    /// ([`deadline::with_deadline`](crate::deadline::with_deadline)).
    ///
    /// # Errors
    /// * [`CallError::KillSwitched`] — the kill switch is off; `attempt` was not called.
    /// * [`CallError::DeadlineExceeded`] — no time left (before the call, while waiting for
    ///   the bulkhead, or for the next retry), chained to the last error.
    /// * [`CallError::BulkheadFull`] — no slot within `max_wait`.
    /// * [`CallError::BreakerOpen`] — the breaker rejects calls; no attempt was made.
    /// * [`CallError::Timeout`] — the last attempt ran past its per-attempt timeout.
    /// * [`CallError::Injected`] — a fault-injection rule failed the last attempt.
    /// * [`CallError::Throttled`] — the client-side throttle refused the last attempt
    ///   locally (the dependency has been rejecting much of this client's traffic).
    /// * [`CallError::Inner`] — the dependency's own error, after any retries.
    pub async fn call<T, E, F, Fut>(&self, operation: &str, attempt: F) -> Result<T, CallError<E>>
    where
        E: Classify,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        // The view is borrowed for the call through an `arc-swap` guard, not cloned out of
        // it: a clone and its drop are two read-modify-writes of a reference count every
        // thread calling this dependency shares. (A thread holding many guards at once gets
        // clones from `arc-swap` itself: never worse than cloning here.)
        let view = self.slot.load();
        run::run(&view, operation, None, attempt, Judgement::classify).await
    }

    /// As [`call`](Self::call), with the caller judging each attempt's result (for
    /// answers that are failures although they are `Ok`, such as an HTTP 503 response) and
    /// stating idempotency when the operation name cannot (`None` = by name and policy).
    /// When retries end on such an answer, it is returned as `Ok`.
    pub async fn call_judged<T, E, F, Fut, J>(
        &self,
        operation: &str,
        idempotent: Option<bool>,
        attempt: F,
        judge: J,
    ) -> Result<T, CallError<E>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        J: Fn(&Result<T, E>) -> Judgement,
    {
        let view = self.slot.load();
        run::run(&view, operation, idempotent, attempt, judge).await
    }

    /// Calls the dependency and, when that fails for any reason (kill switch, open
    /// breaker, full bulkhead, deadline, timeout, error), answers from `fallback` instead.
    ///
    /// Returns the value and where it came from: [`WithFallback::level`] is
    /// [`FallbackLevel::Fresh`] for the dependency's answer and the dependency's configured
    /// `fallback` level otherwise, with the cause in [`WithFallback::cause`]. The fallback gets
    /// the error by reference, runs outside the primary's bulkhead, retries and breaker,
    /// and should be cheap (a cached or static value).
    pub async fn call_or_fallback<T, E, F, Fut, G, GFut>(
        &self,
        operation: &str,
        attempt: F,
        fallback: G,
    ) -> WithFallback<T, E>
    where
        E: Classify,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        G: FnOnce(&CallError<E>) -> GFut,
        GFut: Future<Output = T>,
    {
        let view = self.slot.load();
        let level = view.policy.fallback;
        match run::run(&view, operation, None, attempt, Judgement::classify).await {
            Ok(value) => {
                view.state.fallback.fresh();
                WithFallback { value, level: FallbackLevel::Fresh, cause: None }
            }
            Err(e) => {
                let value = fallback(&e).await;
                view.state.fallback.served(level);
                view.state.health.fallback();
                WithFallback { value, level, cause: Some(e) }
            }
        }
    }

    /// A stale-if-error cache sized for this dependency (`STALE_CACHE_ENTRIES` entries,
    /// values served up to the dependency's `stale_max_age`), for
    /// [`call_stale_if_error`](Self::call_stale_if_error). Create it once and keep it.
    pub fn stale_cache<K: std::hash::Hash + Eq, V: Clone>(&self) -> crate::fallback::StaleCache<K, V> {
        let view = self.slot.load();
        crate::fallback::StaleCache::new(
            crate::policy::defaults::STALE_CACHE_ENTRIES as usize,
            view.policy.stale_max_age,
        )
    }

    /// The STALE fallback level done for the caller (RFC 5861 `stale-if-error`): calls
    /// the dependency as [`call`](Self::call); a fresh answer is stored in `cache` under
    /// `key` and returned at level FRESH; when the call fails for any reason (kill switch
    /// included), the last good answer for `key` is returned at level STALE if it is no
    /// older than the dependency's `stale_max_age` (the current policy's, applied to the
    /// cache on each failure).
    ///
    /// Storing a fresh answer clones it and allocates one cache entry.
    ///
    /// # Errors
    /// The call's [`CallError`] when there is no stale answer young enough: the caller
    /// goes on down its fallback chain (GENERIC, EMPTY_MARKED, …).
    pub async fn call_stale_if_error<K, T, E, F, Fut>(
        &self,
        cache: &crate::fallback::StaleCache<K, T>,
        key: K,
        operation: &str,
        attempt: F,
    ) -> Result<WithFallback<T, E>, CallError<E>>
    where
        K: std::hash::Hash + Eq,
        T: Clone,
        E: Classify,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        match self.call(operation, attempt).await {
            Ok(value) => {
                self.slot.load().state.fallback.fresh();
                cache.put(key, value.clone());
                Ok(WithFallback { value, level: FallbackLevel::Fresh, cause: None })
            }
            Err(e) => {
                let view = self.slot.load();
                cache.set_max_staleness(view.policy.stale_max_age);
                match cache.get_if_error(&key) {
                    Some(stale) => {
                        view.state.fallback.served(FallbackLevel::Stale);
                        view.state.health.fallback();
                        Ok(WithFallback { value: stale.value, level: FallbackLevel::Stale, cause: Some(e) })
                    }
                    None => Err(e),
                }
            }
        }
    }

    /// A pool of endpoints of this dependency (replicas, hosts, channels) with outlier
    /// detection under the dependency's `outlier_detection` settings (Envoy defaults when
    /// the policy has none), for [`call_balanced`](Self::call_balanced). Create it once
    /// and keep it; it registers the `levee_outlier_*` metrics for this dependency.
    pub fn endpoints<P>(&self, endpoints: Vec<P>) -> Endpoints<P> {
        let view = self.slot.load_full();
        let settings = view.policy.outlier_detection.clone().unwrap_or_default();
        let labels = crate::metrics_names::Labels::dependency_wide(&view.name);
        Endpoints {
            detector: crate::outlier::OutlierDetector::with_metrics(&settings, endpoints, &labels),
            applied: ArcSwap::new(view.policy.clone()),
        }
    }

    /// As [`call`](Self::call), spreading attempts over the endpoints of `pool`: each
    /// attempt goes to the next endpoint round robin that outlier detection has not
    /// ejected (so a retry normally lands on another endpoint), and each attempt's outcome
    /// — as the circuit breaker judges it, timeouts included — is recorded for the
    /// endpoint it went to. An endpoint failing `consecutive_errors` times in a row is
    /// ejected for `base_ejection_time × times ejected`; never more than
    /// `max_ejection_percent` of the pool, and never the whole pool.
    ///
    /// `attempt` gets the chosen endpoint. Errors as [`call`](Self::call).
    ///
    /// # Panics
    /// When `pool` has no endpoints.
    pub async fn call_balanced<P, T, E, F, Fut>(
        &self,
        pool: &Endpoints<P>,
        operation: &str,
        mut attempt: F,
    ) -> Result<T, CallError<E>>
    where
        E: Classify,
        F: FnMut(&P) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        assert!(!pool.detector.is_empty(), "call_balanced on an empty endpoint pool");
        let view = self.slot.load();
        pool.follow(&view.policy);
        let current = std::cell::Cell::new(0usize);
        let observe = |outcome: crate::breaker::Outcome| {
            pool.detector.record(current.get(), outcome == crate::breaker::Outcome::Success);
        };
        run::run_observed(
            &view,
            operation,
            None,
            true,
            || {
                let (index, endpoint) = pool.detector.pick().expect("the pool is not empty");
                current.set(index);
                attempt(endpoint)
            },
            Judgement::classify,
            &observe,
        )
        .await
    }

    /// A tower layer enforcing this dependency's policy around a service; the operation
    /// is the dependency as a whole unless set with [`DependencyLayer::operation`].
    pub fn layer(&self) -> DependencyLayer {
        DependencyLayer::new(self.clone())
    }
}

/// What a call with a fallback returns ([`Dependency::call_or_fallback`],
/// [`Dependency::call_stale_if_error`]): the value, the level that produced it, and why
/// the fallback answered.
#[derive(Debug)]
pub struct WithFallback<T, E> {
    /// The answer: the dependency's, or the fallback's.
    pub value: T,
    /// [`FallbackLevel::Fresh`] for the dependency's answer; the dependency's configured
    /// fallback level when the fallback answered.
    pub level: FallbackLevel,
    /// Why the fallback answered; `None` when the dependency did.
    pub cause: Option<CallError<E>>,
}

impl<T, E> WithFallback<T, E> {
    /// Whether the value came from the fallback.
    pub fn is_degraded(&self) -> bool {
        self.cause.is_some()
    }
}

/// Endpoints of one dependency with their outlier-detection state; see
/// [`Dependency::endpoints`] and [`Dependency::call_balanced`].
#[derive(Debug)]
pub struct Endpoints<P> {
    detector: crate::outlier::OutlierDetector<P>,
    /// The dependency policy whose settings the detector has (held, so a new policy is
    /// told apart by pointer).
    applied: ArcSwap<policy::DependencyPolicy>,
}

impl<P> Endpoints<P> {
    /// The outlier detector: ejection state per endpoint ([`OutlierDetector::status`]).
    ///
    /// [`OutlierDetector::status`]: crate::outlier::OutlierDetector::status
    pub fn detector(&self) -> &crate::outlier::OutlierDetector<P> {
        &self.detector
    }

    /// Applies the dependency's current `outlier_detection` settings when the policy
    /// changed since the last call (one pointer comparison otherwise).
    fn follow(&self, policy: &Arc<policy::DependencyPolicy>) {
        if !Arc::ptr_eq(&self.applied.load(), policy) {
            self.applied.store(policy.clone());
            self.detector.update(&policy.outlier_detection.clone().unwrap_or_default());
        }
    }
}
