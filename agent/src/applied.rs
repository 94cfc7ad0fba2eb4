//! The applied snapshot and the rules for reading it: what a flag resolves to, whether a
//! kill switch is on, who is inside a rollout, and when an answer changes by itself (an
//! expiry or a stale deadline).
//!
//! A leaf of the crate: it imports only the policy model. The slot registries that are
//! rewritten from a snapshot (`flags`, `enforce`, `feature`) read it through
//! [`ResolveCtx`], and the shared state that owns them (`state`) builds that context, so
//! none of them needs another.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::policy::{
    BreakerOverride, FaultRule, Flag, FlagType, LeverOverride, ServiceConfig, StalePolicy, Timestamp,
};

/// Where the applied configuration came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// A snapshot from the server, or a cached one the server has since confirmed current.
    Live,
    /// The last good snapshot on disk, not (yet) confirmed by the server.
    Cache,
    /// The safe defaults compiled into the service.
    Default,
}

impl Source {
    /// Lower-case label: `live`, `cache` or `default` (metrics and status reports).
    pub const fn as_str(self) -> &'static str {
        match self {
            Source::Live => "live",
            Source::Cache => "cache",
            Source::Default => "default",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The monotonic instant of the wall-clock time `at`, `wall_now` and `now` being the same
/// moment on either clock: `now + (at − wall_now)`, to the millisecond. A time further in
/// the future than the monotonic clock can express is clamped to 30 years from `now`;
/// `None` when `at` lies before the monotonic clock's origin.
///
/// The agent's only conversion from wall-clock to monotonic time. Expiries people set
/// (flags, breaker overrides, fault rules, levers) are converted once, when a snapshot is applied
/// ([`Applied`]), so their timers run on the tokio clock and a later jump of the wall
/// clock changes nothing; the age of a cached snapshot at startup uses it too.
pub(crate) fn wall_to_monotonic(at: Timestamp, wall_now: Timestamp, now: Instant) -> Option<Instant> {
    const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    let ahead = at.unix_ms().saturating_sub(wall_now.unix_ms());
    let by = Duration::from_millis(ahead.unsigned_abs());
    if ahead >= 0 { Some(now.checked_add(by.min(FAR)).unwrap_or(now)) } else { now.checked_sub(by) }
}

/// Monotonic expiries of one applied configuration, converted once at apply time.
#[derive(Debug, Default)]
struct Expiries {
    /// Per flag key with `expires_at`.
    flags: HashMap<String, Instant>,
    /// Per entry of `breaker_overrides`, in order; `None` = until cleared.
    overrides: Vec<Option<Instant>>,
    /// Per entry of `faults`, in order.
    faults: Vec<Instant>,
    /// Of `levers`, if set.
    levers: Option<Instant>,
}

impl Expiries {
    fn of(config: &ServiceConfig, now: Instant, wall_now: Timestamp) -> Self {
        // An expiry too far in the past for the monotonic clock has simply passed.
        let at = |t: Timestamp| wall_to_monotonic(t, wall_now, now).unwrap_or(now);
        Self {
            flags: config
                .flags
                .iter()
                .filter_map(|(key, flag)| Some((key.clone(), at(flag.expires_at?))))
                .collect(),
            overrides: config.breaker_overrides.iter().map(|o| o.expires_at.map(at)).collect(),
            faults: config.faults.iter().map(|f| at(f.expires_at)).collect(),
            levers: config.levers.as_ref().map(|l| at(l.expires_at)),
        }
    }
}

/// An applied configuration: immutable, swapped atomically as a whole.
#[derive(Debug)]
pub struct Applied {
    /// The configuration being enforced.
    pub config: Arc<ServiceConfig>,
    /// Its revision; 0 for the compiled-in defaults.
    pub revision: u64,
    /// Lower-case hex SHA-256 of the snapshot body; empty for the compiled-in defaults.
    pub hash: String,
    /// Where it came from.
    pub source: Source,
    /// When it was applied (monotonic clock).
    pub applied_at: Instant,
    /// The body text it was decoded from (what the cache stores); `None` for defaults.
    pub(crate) body: Option<Arc<str>>,
    expiries: Arc<Expiries>,
}

impl Applied {
    /// Builds an applied configuration, converting every wall-clock `expires_at` (flags,
    /// breaker overrides, fault rules, levers) into a monotonic instant with
    /// [`wall_to_monotonic`], `now` and `wall_now` being the moment of applying.
    pub(crate) fn new(
        config: impl Into<Arc<ServiceConfig>>,
        revision: u64,
        hash: String,
        source: Source,
        body: Option<Arc<str>>,
        now: Instant,
        wall_now: Timestamp,
    ) -> Self {
        let config = config.into();
        let expiries = Arc::new(Expiries::of(&config, now, wall_now));
        Self { config, revision, hash, source, applied_at: now, body, expiries }
    }

    /// The compiled-in defaults as an applied configuration (revision 0, no hash).
    pub(crate) fn defaults(config: Arc<ServiceConfig>, now: Instant) -> Self {
        Self::new(config, 0, String::new(), Source::Default, None, now, Timestamp::now())
    }

    /// The same configuration with another source (used when the server confirms a
    /// cached snapshot).
    pub(crate) fn with_source(&self, source: Source) -> Self {
        Self {
            config: self.config.clone(),
            revision: self.revision,
            hash: self.hash.clone(),
            source,
            applied_at: self.applied_at,
            body: self.body.clone(),
            expiries: self.expiries.clone(),
        }
    }

    /// The monotonic instant at which the flag `key` expires, if it has an expiry.
    pub fn flag_expiry(&self, key: &str) -> Option<Instant> {
        self.expiries.flags.get(key).copied()
    }

    /// The breaker overrides with the monotonic instant each expires (`None` = until
    /// cleared).
    pub(crate) fn breaker_overrides(&self) -> impl Iterator<Item = (&BreakerOverride, Option<Instant>)> {
        self.config.breaker_overrides.iter().zip(self.expiries.overrides.iter().copied())
    }

    /// The fault rules with the monotonic instant each expires.
    pub(crate) fn fault_rules(&self) -> impl Iterator<Item = (&FaultRule, Instant)> {
        self.config.faults.iter().zip(self.expiries.faults.iter().copied())
    }

    /// The lever override with the monotonic instant it expires.
    pub(crate) fn levers(&self) -> Option<(&LeverOverride, Instant)> {
        self.config.levers.as_ref().zip(self.expiries.levers)
    }
}

/// Parts of the key space used for rollout buckets (a rollout of `p` percent covers
/// `p × 10 000` of them).
pub const ROLLOUT_BUCKETS: u64 = 1_000_000;

/// Rollout bucket of `caller_key` for `flag_key`, in `0..ROLLOUT_BUCKETS`.
///
/// Stable across processes, hosts and releases (part of the contract: the same key lands
/// in the same bucket everywhere): FNV-1a 64 over `flag_key`, a zero byte and `caller_key`,
/// finished with the SplitMix64 mixer, modulo [`ROLLOUT_BUCKETS`].
pub fn rollout_bucket(flag_key: &str, caller_key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in flag_key.bytes().chain(std::iter::once(0)).chain(caller_key.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    h % ROLLOUT_BUCKETS
}

/// A bool flag's rollout: keys whose [`rollout_bucket`] is below `threshold` get `value`,
/// the others the default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Split {
    /// Buckets inside the rollout, `0..=ROLLOUT_BUCKETS`.
    pub(crate) threshold: u64,
    /// What keys inside the rollout get.
    pub(crate) value: bool,
}

impl Split {
    /// Whether every key is inside (a rollout of 100 %, after rounding to buckets).
    pub(crate) const fn covers_all(self) -> bool {
        self.threshold >= ROLLOUT_BUCKETS
    }

    /// Whether `caller_key` is inside a rollout of `threshold` buckets of flag `flag_key`.
    pub(crate) fn inside(threshold: u64, flag_key: &str, caller_key: &str) -> bool {
        rollout_bucket(flag_key, caller_key) < threshold
    }
}

/// What a bool flag answers, given the snapshot's flag (already resolved: `None` when the
/// default applies) and the compiled-in `default`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BoolAnswer {
    /// The answer for a caller without a rollout key.
    pub(crate) unkeyed: bool,
    /// The rollout, when the flag has one.
    pub(crate) split: Option<Split>,
}

impl BoolAnswer {
    /// The rule for bool flags, written once: without a usable snapshot value, the
    /// default; without a rollout, the value; with a rollout, keys inside it get the value
    /// and the others the default — and a caller without a key is inside only a rollout
    /// that covers every bucket.
    pub(crate) fn of(flag: Option<&Flag>, default: bool) -> Self {
        let Some(value) = flag.and_then(|f| f.value.as_bool()) else {
            return Self { unkeyed: default, split: None };
        };
        match flag.and_then(|f| f.rollout.as_ref()) {
            None => Self { unkeyed: value, split: None },
            Some(r) => {
                let threshold =
                    (r.percent.clamp(0.0, 100.0) * (ROLLOUT_BUCKETS as f64 / 100.0)).round() as u64;
                let split = Split { threshold, value };
                Self { unkeyed: if split.covers_all() { value } else { default }, split: Some(split) }
            }
        }
    }
}

/// Why a flag resolved to its default rather than the snapshot's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DefaultReason {
    /// The snapshot has no such flag.
    Absent,
    /// The snapshot's flag has another type.
    WrongType,
    /// `expires_at` has passed.
    Expired,
    /// `revert_after` elapsed without a live confirmation.
    Stale,
}

/// The bool flags declared in code, as far as resolution needs them.
pub(crate) trait DeclaredFlags: fmt::Debug {
    /// The compiled-in default of the first bool flag declared with `key`, if any.
    fn bool_default(&self, key: &str) -> Option<bool>;
}

/// No flags declared.
impl DeclaredFlags for () {
    fn bool_default(&self, _: &str) -> Option<bool> {
        None
    }
}

/// A change to what the status report says about breakers, dependencies on a fallback or
/// degraded features: a generation counter bumped where such a change happens (a breaker
/// transition, a dependency or feature starting or ending its fallback period, on the call
/// path) and a [`Notify`](tokio::sync::Notify) the sync client waits on, so it sends a
/// report at once (debounced by `min_report_gap`) instead of at the next periodic one.
///
/// Signalling is one `fetch_add` and one `notify_one` (a CAS on the notify's state, no
/// allocation); the slots that signal get an `Arc` of it when they are created, through
/// [`ResolveCtx::changes`], so none of them needs the shared state or the sync client.
#[derive(Debug, Default)]
pub(crate) struct StatusChanges {
    generation: std::sync::atomic::AtomicU64,
    notify: tokio::sync::Notify,
}

impl StatusChanges {
    /// Records a change (lock-free when nobody waits, allocation-free).
    #[inline]
    pub(crate) fn changed(&self) {
        self.generation.fetch_add(1, std::sync::atomic::Ordering::Release);
        self.notify.notify_one();
    }

    /// The number of changes so far.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Completes after the next change (or at once if one happened since the last wait).
    pub(crate) async fn notified(&self) {
        self.notify.notified().await
    }
}

/// Everything a slot's resolution reads besides its own name: the applied snapshot, the
/// compiled-in defaults, the declared flags, and the time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ResolveCtx<'a> {
    /// Where slots created by this resolution signal changes to the status report.
    pub(crate) changes: &'a Arc<StatusChanges>,
    pub(crate) applied: &'a Applied,
    /// The service's compiled-in defaults (policy for what the snapshot does not name).
    pub(crate) defaults: &'a ServiceConfig,
    pub(crate) declared: &'a dyn DeclaredFlags,
    pub(crate) now: Instant,
    /// When the configuration was last confirmed live; `None` = never.
    pub(crate) confirmed_at: Option<Instant>,
    /// This agent's instance id (what a fault rule's `instances` name); empty before the
    /// agent has one.
    pub(crate) instance_id: &'a str,
}

impl<'a> ResolveCtx<'a> {
    /// Resolves `key` as a flag of type `want`: the snapshot flag to use, or why the
    /// default applies; plus the instant at which the answer changes by itself (expiry or
    /// stale deadline), if any.
    pub(crate) fn resolve(
        &self,
        key: &str,
        want: FlagType,
    ) -> (Result<&'a Flag, DefaultReason>, Option<Instant>) {
        let Some(flag) = self.applied.config.flags.get(key) else {
            return (Err(DefaultReason::Absent), None);
        };
        if flag.kind != want {
            return (Err(DefaultReason::WrongType), None);
        }
        let mut next = None;
        if let Some(at) = self.applied.flag_expiry(key) {
            if self.now >= at {
                return (Err(DefaultReason::Expired), None);
            }
            next = Some(at);
        }
        if let StalePolicy::RevertAfter(d) = flag.stale {
            let Some(revert_at) = self.confirmed_at.and_then(|c| c.checked_add(d)) else {
                return (Err(DefaultReason::Stale), next);
            };
            if self.now >= revert_at {
                return (Err(DefaultReason::Stale), next);
            }
            next = Some(next.map_or(revert_at, |n: Instant| n.min(revert_at)));
        }
        (Ok(flag), next)
    }

    /// The lever override in force now (`None` once expired, or when there is none), and
    /// the instant it ends by itself. Read through
    /// [`Inbound::with_levers`](crate::policy::Inbound::with_levers).
    pub(crate) fn levers(&self) -> (Option<&'a LeverOverride>, Option<Instant>) {
        match self.applied.levers() {
            Some((l, until)) if until > self.now => (Some(l), Some(until)),
            _ => (None, None),
        }
    }

    /// Whether the kill switch `key` (a dependency's or a feature's `enabled_flag`) lets
    /// calls through, and when that changes by itself. No switch: on.
    ///
    /// # The rule
    /// A kill switch is an unkeyed read of its bool flag, with the default of the bool
    /// flag declared in code under that key, else `true`: exactly what
    /// [`FlagBool::get`](crate::FlagBool::get) of such a handle returns. So a dependency,
    /// a feature and a handle on the same key never disagree. Under a rollout below 100 %
    /// a switch takes its default: a call carries no rollout key, and the keys outside a
    /// rollout get the default, as [`FlagBool::get_for`](crate::FlagBool::get_for) gives
    /// them. Turning a switch off for everyone is `false` without a rollout.
    pub(crate) fn switch_on(&self, key: Option<&str>) -> (bool, Option<Instant>) {
        let Some(key) = key else { return (true, None) };
        let default = self.declared.bool_default(key).unwrap_or(true);
        let (flag, wake) = self.resolve(key, FlagType::Bool);
        (BoolAnswer::of(flag.ok(), default).unkeyed, wake)
    }
}

#[cfg(test)]
mod tests;
