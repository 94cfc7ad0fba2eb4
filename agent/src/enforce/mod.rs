//! Local enforcement of a dependency's policy around outgoing calls.
//!
//! [`Dependency`] is the handle (`agent.dependency("recommendations")`); its
//! [`call`](Dependency::call) wraps any future, [`call_or_fallback`](Dependency::call_or_fallback)
//! adds a fallback, and [`DependencyLayer`] does the same for any `tower::Service`. All three
//! go through [`run`], the one place that decides the order of enforcement.
//!
//! The hot path reads the dependency's resolved view with one lock-free `arc-swap` load
//! and takes no lock; the view is rewritten whenever a snapshot is applied or a flag
//! changes.

mod error;
mod layer;

#[cfg(test)]
mod tests;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;

pub use error::{AttemptTimeout, CallError, KillSwitched, NotReplayable};
pub use layer::{DependencyLayer, DependencyService};

use crate::flags::{FlagRegistry, ResolveCtx};
use crate::policy::{self, FallbackLevel, FlagType, ServiceConfig};

/// A dependency's policy as resolved for the hot path.
#[derive(Debug)]
pub(crate) struct DepView {
    pub(crate) policy: Arc<policy::Dependency>,
    /// Whether the kill switch lets calls through.
    pub(crate) enabled: bool,
}

impl DepView {
    fn resolve(
        name: &str,
        ctx: &ResolveCtx<'_>,
        defaults: &ServiceConfig,
        flags: &FlagRegistry,
    ) -> (Self, Option<Instant>) {
        let policy = ctx
            .applied
            .config
            .policy
            .dependencies
            .get(name)
            .or_else(|| defaults.policy.dependencies.get(name))
            .cloned()
            .unwrap_or_default();
        let (enabled, wake) = match &policy.enabled_flag {
            None => (true, None),
            Some(key) => match flags.bool_handle(key) {
                // A declared handle already resolved server value / expiry / stale policy
                // against its compiled-in default.
                Some(handle) => (handle.get(), None),
                None => {
                    let (flag, wake) = ctx.resolve(key, FlagType::Bool);
                    let on = flag.ok().map(|f| {
                        let full = f.rollout.as_ref().is_none_or(|r| r.percent >= 100.0);
                        f.value.as_bool().unwrap_or(true) || !full
                    });
                    (on.unwrap_or(true), wake)
                }
            },
        };
        (Self { policy: Arc::new(policy), enabled }, wake)
    }

    /// The per-attempt timeout of `operation`: the operation's override, else the
    /// dependency's.
    fn attempt_timeout(&self, operation: &str) -> Duration {
        self.policy
            .operations
            .get(operation)
            .and_then(|o| o.attempt_timeout)
            .unwrap_or(self.policy.attempt_timeout)
    }
}

/// Every dependency handle of one agent, by name.
type DepSlot = Arc<ArcSwap<DepView>>;

#[derive(Default)]
pub(crate) struct DepRegistry {
    slots: ArcSwap<Vec<(Arc<str>, DepSlot)>>,
}

impl fmt::Debug for DepRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DepRegistry").field("dependencies", &self.slots.load().len()).finish()
    }
}

impl DepRegistry {
    /// The slot of `name`, created (and resolved) on first use.
    pub(crate) fn handle(
        &self,
        name: &str,
        ctx: &ResolveCtx<'_>,
        defaults: &ServiceConfig,
        flags: &FlagRegistry,
    ) -> Dependency {
        if let Some((n, slot)) = self.slots.load().iter().find(|(n, _)| &**n == name) {
            return Dependency { name: n.clone(), slot: slot.clone() };
        }
        let (view, _) = DepView::resolve(name, ctx, defaults, flags);
        let name: Arc<str> = name.into();
        let slot = Arc::new(ArcSwap::from_pointee(view));
        let mut out = None;
        self.slots.rcu(|v| {
            if let Some((n, s)) = v.iter().find(|(n, _)| *n == name) {
                out = Some(Dependency { name: n.clone(), slot: s.clone() });
                return Vec::clone(v);
            }
            out = Some(Dependency { name: name.clone(), slot: slot.clone() });
            let mut v = Vec::clone(v);
            v.push((name.clone(), slot.clone()));
            v
        });
        out.expect("rcu ran at least once")
    }

    /// Re-resolves every slot; returns the next instant a kill switch changes by itself.
    pub(crate) fn refresh(
        &self,
        ctx: &ResolveCtx<'_>,
        defaults: &ServiceConfig,
        flags: &FlagRegistry,
    ) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for (name, slot) in self.slots.load().iter() {
            let (view, wake) = DepView::resolve(name, ctx, defaults, flags);
            slot.store(Arc::new(view));
            if let Some(w) = wake {
                next = Some(next.map_or(w, |n| n.min(w)));
            }
        }
        next
    }
}

/// A handle on one outgoing dependency. Cheap to clone; every call reads the dependency's
/// current policy with one lock-free load.
///
/// An unknown dependency (named neither in the applied snapshot nor in the compiled-in
/// defaults) is enforced with [`policy::Dependency::default()`].
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

/// What one call will enforce, read once from the current policy at the call's start.
#[derive(Clone, Debug)]
pub(crate) struct CallPlan {
    pub(crate) dependency: Arc<str>,
    pub(crate) enabled: bool,
    pub(crate) attempt_timeout: Duration,
}

impl Dependency {
    /// Name of the dependency.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The dependency's current policy (from the applied snapshot, else the compiled-in
    /// defaults, else [`policy::Dependency::default()`]).
    pub fn policy(&self) -> Arc<policy::Dependency> {
        self.slot.load().policy.clone()
    }

    /// Whether the kill switch currently lets calls through: the `enabled_flag`'s value
    /// (server value, else the declared default of a handle with that key, else `true`);
    /// `true` without an `enabled_flag`.
    pub fn is_enabled(&self) -> bool {
        self.slot.load().enabled
    }

    /// The per-attempt timeout `operation` gets now: the operation's override, else the
    /// dependency's `attempt_timeout`.
    pub fn attempt_timeout(&self, operation: &str) -> Duration {
        self.slot.load().attempt_timeout(operation)
    }

    pub(crate) fn plan(&self, operation: &str) -> CallPlan {
        let view = self.slot.load();
        CallPlan {
            dependency: self.name.clone(),
            enabled: view.enabled,
            attempt_timeout: view.attempt_timeout(operation),
        }
    }

    /// Calls the dependency under its policy.
    ///
    /// Inputs: `operation` (a route template or method name; selects per-operation
    /// overrides; use the dependency name when there is only one), and `attempt`, which
    /// makes the future of one attempt (it may be called again by later retry stages).
    ///
    /// # Errors
    /// * [`CallError::KillSwitched`] — the kill switch is off; `attempt` was not called
    ///   and no future was polled.
    /// * [`CallError::Timeout`] — the attempt ran past the per-attempt timeout; its future
    ///   was dropped.
    /// * [`CallError::Inner`] — the dependency's own error.
    pub async fn call<T, E, F, Fut>(&self, operation: &str, attempt: F) -> Result<T, CallError<E>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        run(self.plan(operation), attempt).await
    }

    /// Calls the dependency and, when that fails for any reason (including the kill
    /// switch), answers from `fallback` instead.
    ///
    /// Returns the value and where it came from: [`Degraded::level`] is
    /// [`FallbackLevel::Fresh`] for the dependency's answer and the dependency's configured
    /// `fallback` level otherwise, with the cause in [`Degraded::cause`]. The fallback gets
    /// the error by reference and is not subject to the primary's policy.
    pub async fn call_or_fallback<T, E, F, Fut, G, GFut>(
        &self,
        operation: &str,
        attempt: F,
        fallback: G,
    ) -> Degraded<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        G: FnOnce(&CallError<E>) -> GFut,
        GFut: Future<Output = T>,
    {
        let level = self.slot.load().policy.fallback;
        match self.call(operation, attempt).await {
            Ok(value) => Degraded { value, level: FallbackLevel::Fresh, cause: None },
            Err(e) => {
                let value = fallback(&e).await;
                Degraded { value, level, cause: Some(e) }
            }
        }
    }

    /// A tower layer enforcing this dependency's policy around a service; the operation
    /// is the dependency as a whole unless set with [`DependencyLayer::operation`].
    pub fn layer(&self) -> DependencyLayer {
        DependencyLayer::new(self.clone())
    }
}

/// A value and which fallback level produced it.
#[derive(Debug)]
pub struct Degraded<T, E> {
    /// The answer: the dependency's, or the fallback's.
    pub value: T,
    /// [`FallbackLevel::Fresh`] for the dependency's answer; the dependency's configured
    /// fallback level when the fallback answered.
    pub level: FallbackLevel,
    /// Why the fallback answered; `None` when the dependency did.
    pub cause: Option<CallError<E>>,
}

impl<T, E> Degraded<T, E> {
    /// Whether the value came from the fallback.
    pub fn is_degraded(&self) -> bool {
        self.cause.is_some()
    }
}

/// Runs one call through every enforcement stage, in order. This is the only place that
/// decides the order; [`Dependency::call`], [`Dependency::call_or_fallback`] and
/// [`DependencyService`] all come through here.
///
/// # Order
/// Outside → in, each stage wrapping the next:
///
/// 1. **kill switch** — an off switch rejects with [`KillSwitched`] before anything else:
///    no permit taken, no attempt made, nothing recorded;
/// 2. **bulkhead** — (next milestone) a permit per (dependency, operation), held for the
///    whole call including retries;
/// 3. **retry** — (next milestone) re-runs the stages below with backoff and budget;
/// 4. **circuit breaker** — (next milestone) inside the retry so it sees every attempt and
///    an open breaker ends the retry loop at once (`BreakerOpen` is not retryable);
/// 5. **per-attempt timeout** — bounds each attempt ([`AttemptTimeout`]);
/// 6. **the call** — `attempt()`.
///
/// The breaker sits inside the retry (not outside, as the article's drawing has it) for
/// the article's own reasons: it must count each failed attempt, and no retry may run
/// while it is open.
pub(crate) async fn run<T, E, F, Fut>(plan: CallPlan, mut attempt: F) -> Result<T, CallError<E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    // 1. kill switch
    if !plan.enabled {
        return Err(CallError::KillSwitched(KillSwitched::new(plan.dependency)));
    }
    // 2.–4. bulkhead, retry, breaker: slot in here, in this order.
    // 5. per-attempt timeout around 6. the call.
    match tokio::time::timeout(plan.attempt_timeout, attempt()).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(CallError::Inner(e)),
        Err(_) => Err(CallError::Timeout(AttemptTimeout::new(plan.dependency, plan.attempt_timeout))),
    }
}
