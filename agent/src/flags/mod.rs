//! Typed flags (kill switches and tunables) declared in code with a safe default.
//!
//! `agent.flag_bool("recommendations.enabled", true)` returns a [`FlagBool`] whose
//! [`get`](FlagBool::get) is one relaxed atomic load: every declared flag owns a slot that
//! the agent rewrites whenever the value can change (a snapshot is applied, the server
//! confirms the configuration, or a timer fires at the next expiry / stale deadline), so
//! a read never looks at the snapshot, a map or a clock.
//!
//! # Resolution
//! On every rewrite, each declared flag resolves to:
//! 1. the compiled-in default when the snapshot has no flag with that key (the flag was
//!    deleted on the server: CP-9);
//! 2. the default, with a warning, when the snapshot's flag has another type;
//! 3. the default once `expires_at` has passed (measured on the monotonic clock from the
//!    moment the snapshot was applied);
//! 4. the default when the flag's stale policy is `revert_after(d)` and the configuration
//!    has not been confirmed live for `d` or longer;
//! 5. otherwise the snapshot's value. A bool flag with a `rollout` gives that value only to
//!    the share of caller keys inside the rollout ([`FlagBool::get_for`]); unkeyed reads
//!    see it only at 100 %.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arc_swap::ArcSwap;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::applied::{BoolAnswer, DeclaredFlags, DefaultReason, ResolveCtx, Split};
pub use crate::applied::{ROLLOUT_BUCKETS, rollout_bucket};
use crate::policy::{Flag, FlagType};

#[cfg(test)]
pub(crate) mod tests;

const BIT_VALUE: u64 = 1;
const BIT_ROLLOUT: u64 = 1 << 1;
const BIT_ROLLOUT_VALUE: u64 = 1 << 2;

/// A bool flag handle. Cheap to clone; reads are one atomic load.
#[derive(Clone)]
pub struct FlagBool {
    slot: Arc<AtomicU64>,
    key: Arc<str>,
    default: bool,
}

impl FlagBool {
    /// The current value for callers without a rollout key: the server's value, or the
    /// compiled-in default (see the [module docs](self) for when). With a rollout below
    /// 100 %, unkeyed callers count as outside it and get the default.
    #[inline]
    pub fn get(&self) -> bool {
        self.slot.load(Ordering::Relaxed) & BIT_VALUE != 0
    }

    /// The value for one caller key (a user or tenant id) under percentage rollout: keys
    /// whose [`rollout_bucket`] falls inside the rollout get the server's value, the others
    /// the default. Without a rollout this is [`get`](Self::get). Stable: the same key gets
    /// the same answer for the same percentage, and raising the percentage only adds keys.
    pub fn get_for(&self, caller_key: &str) -> bool {
        let bits = self.slot.load(Ordering::Relaxed);
        if bits & BIT_ROLLOUT == 0 {
            return bits & BIT_VALUE != 0;
        }
        if Split::inside(bits >> 32, &self.key, caller_key) {
            bits & BIT_ROLLOUT_VALUE != 0
        } else {
            self.default
        }
    }

    /// The key it was declared with: the server's flag key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The default declared in code: the value while the snapshot has none usable.
    pub fn default_value(&self) -> bool {
        self.default
    }

    /// Whether the server's flag has a rollout (keyed reads may differ from unkeyed ones).
    #[cfg_attr(not(feature = "openfeature"), allow(dead_code))]
    pub(crate) fn has_rollout(&self) -> bool {
        self.slot.load(Ordering::Relaxed) & BIT_ROLLOUT != 0
    }
}

impl fmt::Debug for FlagBool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlagBool").field("key", &self.key).field("value", &self.get()).finish()
    }
}

/// An integer flag handle. Cheap to clone; reads are one atomic load.
#[derive(Clone)]
pub struct FlagInt {
    slot: Arc<AtomicU64>,
    key: Arc<str>,
    default: i64,
}

impl FlagInt {
    /// The current value: the server's, or the compiled-in default.
    #[inline]
    pub fn get(&self) -> i64 {
        self.slot.load(Ordering::Relaxed) as i64
    }

    /// The key it was declared with: the server's flag key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The default declared in code: the value while the snapshot has none usable.
    pub fn default_value(&self) -> i64 {
        self.default
    }
}

impl fmt::Debug for FlagInt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlagInt").field("key", &self.key).field("value", &self.get()).finish()
    }
}

/// A float flag handle. Cheap to clone; reads are one atomic load.
#[derive(Clone)]
pub struct FlagFloat {
    slot: Arc<AtomicU64>,
    key: Arc<str>,
    default: f64,
}

impl FlagFloat {
    /// The current value: the server's (always finite), or the compiled-in default.
    #[inline]
    pub fn get(&self) -> f64 {
        f64::from_bits(self.slot.load(Ordering::Relaxed))
    }

    /// The key it was declared with: the server's flag key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The default declared in code: the value while the snapshot has none usable.
    pub fn default_value(&self) -> f64 {
        self.default
    }
}

impl fmt::Debug for FlagFloat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlagFloat").field("key", &self.key).field("value", &self.get()).finish()
    }
}

/// A string flag handle. Cheap to clone; a read is a lock-free `arc-swap` load.
#[derive(Clone)]
pub struct FlagString {
    slot: Arc<ArcSwap<String>>,
    key: Arc<str>,
    default: Arc<String>,
}

impl FlagString {
    /// The current value (shared, no copy): the server's, or the compiled-in default.
    pub fn get(&self) -> Arc<String> {
        self.slot.load_full()
    }

    /// The key it was declared with: the server's flag key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The default declared in code: the value while the snapshot has none usable.
    pub fn default_value(&self) -> &str {
        &self.default
    }
}

impl fmt::Debug for FlagString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlagString").field("key", &self.key).field("value", &self.get()).finish()
    }
}

/// A JSON flag handle. Cheap to clone; a read is a lock-free `arc-swap` load.
#[derive(Clone)]
pub struct FlagJson {
    slot: Arc<ArcSwap<serde_json::Value>>,
    key: Arc<str>,
    default: Arc<serde_json::Value>,
}

impl FlagJson {
    /// The current value (shared, no copy): the server's, or the compiled-in default.
    pub fn get(&self) -> Arc<serde_json::Value> {
        self.slot.load_full()
    }

    /// The current value decoded as `T`.
    ///
    /// # Errors
    /// The `serde_json` error when the value does not have `T`'s shape.
    pub fn get_as<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(&*self.slot.load_full())
    }

    /// The key it was declared with: the server's flag key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The default declared in code: the value while the snapshot has none usable.
    pub fn default_value(&self) -> &serde_json::Value {
        &self.default
    }
}

impl fmt::Debug for FlagJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlagJson").field("key", &self.key).field("value", &self.get()).finish()
    }
}

/// One declared flag: its key, default and the slot its handles read.
#[derive(Clone)]
pub(crate) enum Declared {
    Bool(FlagBool),
    Int(FlagInt),
    Float(FlagFloat),
    String(FlagString),
    Json(FlagJson),
}

impl Declared {
    fn key(&self) -> &str {
        match self {
            Declared::Bool(h) => &h.key,
            Declared::Int(h) => &h.key,
            Declared::Float(h) => &h.key,
            Declared::String(h) => &h.key,
            Declared::Json(h) => &h.key,
        }
    }

    fn kind(&self) -> FlagType {
        match self {
            Declared::Bool(_) => FlagType::Bool,
            Declared::Int(_) => FlagType::Int,
            Declared::Float(_) => FlagType::Float,
            Declared::String(_) => FlagType::String,
            Declared::Json(_) => FlagType::Json,
        }
    }

    /// Writes the resolved value into the slot.
    fn write(&self, flag: Option<&Flag>) {
        match self {
            Declared::Bool(h) => {
                let bits = bool_bits(h.default, flag);
                h.slot.store(bits, Ordering::Relaxed);
            }
            Declared::Int(h) => {
                let v = flag.and_then(|f| f.value.as_i64()).unwrap_or(h.default);
                h.slot.store(v as u64, Ordering::Relaxed);
            }
            Declared::Float(h) => {
                let v = flag.and_then(|f| f.value.as_f64()).filter(|v| v.is_finite()).unwrap_or(h.default);
                h.slot.store(v.to_bits(), Ordering::Relaxed);
            }
            Declared::String(h) => {
                let v = flag.and_then(|f| f.value.as_str());
                match v {
                    Some(s) if s != h.slot.load().as_str() => h.slot.store(Arc::new(s.to_string())),
                    Some(_) => {}
                    None if !Arc::ptr_eq(&h.slot.load(), &h.default) => h.slot.store(h.default.clone()),
                    None => {}
                }
            }
            Declared::Json(h) => match flag {
                Some(f) if f.value != **h.slot.load() => h.slot.store(Arc::new(f.value.clone())),
                Some(_) => {}
                None if !Arc::ptr_eq(&h.slot.load(), &h.default) => h.slot.store(h.default.clone()),
                None => {}
            },
        }
    }
}

/// Packs a bool flag's [`BoolAnswer`] into its slot: bit 0 the unkeyed answer, bit 1 "has
/// a rollout", bit 2 the value inside the rollout, bits 32.. the rollout threshold.
fn bool_bits(default: bool, flag: Option<&Flag>) -> u64 {
    let answer = BoolAnswer::of(flag, default);
    let mut bits = u64::from(answer.unkeyed);
    if let Some(split) = answer.split {
        bits |= BIT_ROLLOUT | (split.threshold << 32);
        if split.value {
            bits |= BIT_ROLLOUT_VALUE;
        }
    }
    bits
}

/// Every declared flag of one agent.
#[derive(Default)]
pub(crate) struct FlagRegistry {
    declared: ArcSwap<Vec<Declared>>,
    /// Revision whose type mismatches were last warned about (warn once per revision).
    warned_revision: AtomicU64,
    warned_any: AtomicBool,
}

impl fmt::Debug for FlagRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlagRegistry").field("declared", &self.declared.load().len()).finish()
    }
}

impl FlagRegistry {
    pub(crate) fn declare_bool(&self, key: &str, default: bool, ctx: &ResolveCtx<'_>) -> FlagBool {
        let h = FlagBool { slot: Arc::new(AtomicU64::new(u64::from(default))), key: key.into(), default };
        self.add(Declared::Bool(h.clone()), ctx);
        h
    }

    pub(crate) fn declare_int(&self, key: &str, default: i64, ctx: &ResolveCtx<'_>) -> FlagInt {
        let h = FlagInt { slot: Arc::new(AtomicU64::new(default as u64)), key: key.into(), default };
        self.add(Declared::Int(h.clone()), ctx);
        h
    }

    pub(crate) fn declare_float(&self, key: &str, default: f64, ctx: &ResolveCtx<'_>) -> FlagFloat {
        let h = FlagFloat { slot: Arc::new(AtomicU64::new(default.to_bits())), key: key.into(), default };
        self.add(Declared::Float(h.clone()), ctx);
        h
    }

    pub(crate) fn declare_string(&self, key: &str, default: String, ctx: &ResolveCtx<'_>) -> FlagString {
        let default = Arc::new(default);
        let h = FlagString { slot: Arc::new(ArcSwap::new(default.clone())), key: key.into(), default };
        self.add(Declared::String(h.clone()), ctx);
        h
    }

    pub(crate) fn declare_json(
        &self,
        key: &str,
        default: serde_json::Value,
        ctx: &ResolveCtx<'_>,
    ) -> FlagJson {
        let default = Arc::new(default);
        let h = FlagJson { slot: Arc::new(ArcSwap::new(default.clone())), key: key.into(), default };
        self.add(Declared::Json(h.clone()), ctx);
        h
    }

    fn add(&self, d: Declared, ctx: &ResolveCtx<'_>) {
        let (flag, _) = ctx.resolve(d.key(), d.kind());
        d.write(flag.ok());
        self.declared.rcu(|v| {
            let mut v = Vec::clone(v);
            v.push(d.clone());
            v
        });
    }

    /// Looks up a declared handle of the given key and type (used by the OpenFeature
    /// provider so it answers exactly as the handles do).
    #[cfg_attr(not(feature = "openfeature"), allow(dead_code))]
    pub(crate) fn declared(&self, key: &str, kind: FlagType) -> Option<Declared> {
        self.declared.load().iter().find(|d| d.key() == key && d.kind() == kind).cloned()
    }

    /// Rewrites every slot; returns the next instant at which some flag's resolution
    /// changes by itself.
    pub(crate) fn refresh(&self, ctx: &ResolveCtx<'_>) -> Option<Instant> {
        let revision = ctx.applied.revision;
        let warn = !self.warned_any.swap(true, Ordering::Relaxed)
            || self.warned_revision.swap(revision, Ordering::Relaxed) != revision;
        self.warned_revision.store(revision, Ordering::Relaxed);
        let mut next: Option<Instant> = None;
        for d in self.declared.load().iter() {
            let (flag, wake) = ctx.resolve(d.key(), d.kind());
            if warn && matches!(flag, Err(DefaultReason::WrongType)) {
                let found = ctx.applied.config.flags.get(d.key()).map(|f| f.kind.as_str()).unwrap_or("?");
                tracing::warn!(
                    flag = d.key(),
                    declared = d.kind().as_str(),
                    found,
                    revision,
                    "flag has another type on the server than declared in code; using the compiled-in default"
                );
            }
            d.write(flag.ok());
            if let Some(w) = wake {
                next = Some(next.map_or(w, |n| n.min(w)));
            }
        }
        next
    }
}

impl DeclaredFlags for FlagRegistry {
    fn bool_default(&self, key: &str) -> Option<bool> {
        self.declared.load().iter().find_map(|d| match d {
            Declared::Bool(h) if &*h.key == key => Some(h.default),
            _ => None,
        })
    }
}
