//! Named slots that handles read and the agent rewrites from every applied snapshot: one
//! mechanism for dependencies and features.
//!
//! A handle (`agent.dependency("x")`, `agent.feature("y")`) owns an `Arc<ArcSwap<V>>`
//! slot: reading it is one lock-free load. [`Registry::refresh`] re-resolves every slot
//! from a [`ResolveCtx`] when a snapshot is applied, the server confirms it, a flag is
//! declared, or the housekeeping timer fires at the next time-driven change.
//!
//! # Bounded cardinality
//! A registry tracks at most [`Resolve::CAP`] names. Past the cap, a name that neither the
//! applied snapshot nor the compiled-in defaults configure shares one slot named
//! [`Resolve::OVERFLOW`], resolved like any unknown name (the default policy, with its
//! own guards). Such a name would get the default policy anyway, so sharing its slot
//! removes no protection; it is logged and counted in
//! [`TRACKING_OVERFLOW_TOTAL`](crate::metrics_names::TRACKING_OVERFLOW_TOTAL) with a `kind`
//! label. A configured name always gets its own slot, so a policy's kill switches and
//! breakers are never bypassed because code asked for many other names first.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::time::Instant;

use crate::applied::ResolveCtx;
use crate::metrics_names;

/// What a registry's slots hold: a view resolved from the applied snapshot.
pub(crate) trait Resolve: Sized + Send + Sync + 'static {
    /// What a slot tracks, as the `kind` label of the overflow metric: `dependency`,
    /// `feature`.
    const KIND: &'static str;
    /// Most names tracked one by one.
    const CAP: usize;
    /// The name shared by unconfigured names past [`CAP`](Self::CAP).
    const OVERFLOW: &'static str;

    /// The view of `name` under `ctx`, and the next instant at which it changes by itself
    /// (an expiry, a stale deadline), if any. `previous` is the slot's current view (state
    /// that outlives a snapshot, such as breakers, is taken over from it); `None` for a new
    /// slot.
    fn resolve(name: &Arc<str>, previous: Option<&Self>, ctx: &ResolveCtx<'_>) -> (Self, Option<Instant>);

    /// Whether the applied snapshot or the compiled-in defaults configure `name`.
    fn configured(name: &str, ctx: &ResolveCtx<'_>) -> bool;
}

/// One slot: what handles of one name read.
pub(crate) type Slot<V> = Arc<ArcSwap<V>>;

/// The slots of one kind of handle, by name; see the [module docs](self).
pub(crate) struct Registry<V> {
    slots: ArcSwap<Vec<(Arc<str>, Slot<V>)>>,
    cap: usize,
    /// `environment` and `service` labels of the overflow counter.
    labels: [(&'static str, String); 2],
}

impl<V> fmt::Debug for Registry<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry").field("slots", &self.slots.load().len()).field("cap", &self.cap).finish()
    }
}

impl<V: Resolve> Registry<V> {
    /// An empty registry of an agent of `environment` / `service` (the labels of its
    /// overflow counter), capped at [`Resolve::CAP`].
    pub(crate) fn new(environment: &str, service: &str) -> Self {
        Self::with_cap(V::CAP, environment, service)
    }

    /// As [`new`](Self::new) with another cap (tests).
    pub(crate) fn with_cap(cap: usize, environment: &str, service: &str) -> Self {
        Self {
            slots: ArcSwap::from_pointee(Vec::new()),
            cap,
            labels: [("environment", environment.to_string()), ("service", service.to_string())],
        }
    }

    fn find(&self, name: &str) -> Option<(Arc<str>, Slot<V>)> {
        self.slots.load().iter().find(|(n, _)| &**n == name).map(|(n, s)| (n.clone(), s.clone()))
    }

    /// The slot of `name` (the name it is tracked under, and the slot), created and
    /// resolved on first use; past the cap, the overflow slot for an unconfigured name.
    pub(crate) fn slot(&self, name: &str, ctx: &ResolveCtx<'_>) -> (Arc<str>, Slot<V>) {
        if let Some(found) = self.find(name) {
            return found;
        }
        let name = if self.slots.load().len() >= self.cap && !V::configured(name, ctx) {
            tracing::warn!(
                kind = V::KIND,
                name,
                cap = self.cap,
                overflow = V::OVERFLOW,
                "too many names tracked; this one shares the overflow slot"
            );
            let [(k1, v1), (k2, v2)] = &self.labels;
            metrics::counter!(
                metrics_names::TRACKING_OVERFLOW_TOTAL,
                *k1 => v1.clone(),
                *k2 => v2.clone(),
                "kind" => V::KIND,
            )
            .increment(1);
            if let Some(found) = self.find(V::OVERFLOW) {
                return found;
            }
            V::OVERFLOW
        } else {
            name
        };
        let name: Arc<str> = name.into();
        let (view, _) = V::resolve(&name, None, ctx);
        let slot = Arc::new(ArcSwap::from_pointee(view));
        let mut out = None;
        self.slots.rcu(|v| {
            if let Some((n, s)) = v.iter().find(|(n, _)| *n == name) {
                out = Some((n.clone(), s.clone()));
                return Vec::clone(v);
            }
            out = Some((name.clone(), slot.clone()));
            let mut v = Vec::clone(v);
            v.push((name.clone(), slot.clone()));
            v
        });
        out.expect("rcu ran at least once")
    }

    /// Re-resolves every slot; returns the next instant at which some slot changes by
    /// itself.
    pub(crate) fn refresh(&self, ctx: &ResolveCtx<'_>) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for (name, slot) in self.slots.load().iter() {
            let (view, wake) = V::resolve(name, Some(&slot.load()), ctx);
            slot.store(Arc::new(view));
            if let Some(w) = wake {
                next = Some(next.map_or(w, |n| n.min(w)));
            }
        }
        next
    }

    /// Every tracked name with its slot, in registration order.
    pub(crate) fn all(&self) -> Arc<Vec<(Arc<str>, Slot<V>)>> {
        self.slots.load_full()
    }
}

#[cfg(test)]
mod tests;
