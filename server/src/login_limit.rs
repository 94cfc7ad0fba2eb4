//! The login limiter: throttles password guessing per (account, client address) and per
//! client address, without handing attackers a way to lock an owner out. It knows nothing
//! about passwords, tokens or the store; `auth::login_to` asks it before checking a
//! password and tells it the outcome.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

/// Failed logins of one account from one client address that cost nothing; each one past
/// them makes that pair wait ([`login_delay`]).
pub const LOGIN_FREE_FAILURES: u32 = 5;
/// Failed logins from one client address, over every account, that cost nothing; past
/// them the whole address waits (password spraying across usernames).
pub const LOGIN_ADDRESS_FREE_FAILURES: u32 = 20;
/// Wait after the first failure past the free ones; it doubles with each further failure.
pub const LOGIN_BASE_DELAY: Duration = Duration::from_secs(1);
/// Longest wait, of an (account, address) pair and of an address: the owner of an account
/// is never held up for longer, even from the attacker's address.
pub const LOGIN_MAX_DELAY: Duration = Duration::from_secs(30);
/// A key's failures are forgotten after this long without a new one.
pub const LOGIN_FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// Most (account, address) and address entries kept; past it the oldest are dropped.
pub const LOGIN_MAX_TRACKED: usize = 100_000;

/// The wait after `failures` failures when `free` of them cost nothing: none up to
/// `free`, then [`LOGIN_BASE_DELAY`] doubling per failure, at most `max`.
pub fn login_delay(failures: u32, free: u32, max: Duration) -> Duration {
    if failures <= free {
        return Duration::ZERO;
    }
    let doublings = (failures - free - 1).min(16);
    LOGIN_BASE_DELAY.saturating_mul(1 << doublings).min(max)
}

#[derive(Clone, Copy, Debug)]
struct Failures {
    count: u32,
    last: Instant,
    /// No attempt is checked before this.
    until: Instant,
}

impl Failures {
    fn fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last) < LOGIN_FORGET_AFTER
    }

    fn fail(entry: Option<Failures>, now: Instant, free: u32, max: Duration) -> Failures {
        let count = entry.filter(|e| e.fresh(now)).map_or(0, |e| e.count).saturating_add(1);
        Failures { count, last: now, until: now + login_delay(count, free, max) }
    }
}

/// Which key made a login wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThrottledBy {
    /// This account from this address ([`LOGIN_FREE_FAILURES`]).
    AccountAndAddress,
    /// This address, over every account ([`LOGIN_ADDRESS_FREE_FAILURES`]).
    Address,
}

impl ThrottledBy {
    /// `account+address` or `address`, as logged and audited.
    pub const fn as_str(self) -> &'static str {
        match self {
            ThrottledBy::AccountAndAddress => "account+address",
            ThrottledBy::Address => "address",
        }
    }
}

/// A login refused before its password was checked, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttled {
    /// How long until an attempt is checked again.
    pub retry_after: Duration,
    /// Which limit it hit.
    pub by: ThrottledBy,
}

/// Throttles password guessing without handing attackers a way to lock an owner out
/// (scenario SEC-1).
///
/// Failures are counted per (account, client address) and per client address. Past the
/// free failures a key waits, growing from [`LOGIN_BASE_DELAY`] to at most
/// [`LOGIN_MAX_DELAY`]; an attempt made while waiting is refused without checking the password and
/// does not lengthen the wait. There is no lockout per account alone: wrong passwords for
/// `admin` from one address never slow down `admin` logging in from another, and even
/// from the same address the wait never exceeds [`LOGIN_MAX_DELAY`]. A success clears the
/// (account, address) count, never the address's. Both waits are capped at
/// [`LOGIN_MAX_DELAY`]. Counts are forgotten after
/// [`LOGIN_FORGET_AFTER`] without a failure. Memory is bounded by [`LOGIN_MAX_TRACKED`].
#[derive(Debug, Default)]
pub struct LoginLimiter {
    state: tokio::sync::Mutex<LimiterState>,
}

#[derive(Debug, Default)]
struct LimiterState {
    pairs: HashMap<(String, IpAddr), Failures>,
    addresses: HashMap<IpAddr, Failures>,
}

fn bound<K: Eq + std::hash::Hash + Clone>(m: &mut HashMap<K, Failures>, now: Instant) {
    if m.len() < LOGIN_MAX_TRACKED {
        return;
    }
    m.retain(|_, f| f.fresh(now));
    if m.len() >= LOGIN_MAX_TRACKED {
        // Still full of fresh keys: drop the oldest half.
        let mut lasts: Vec<Instant> = m.values().map(|f| f.last).collect();
        lasts.sort_unstable();
        let cut = lasts[lasts.len() / 2];
        m.retain(|_, f| f.last > cut);
    }
}

impl LoginLimiter {
    /// Whether an attempt for `user` from `addr` is checked now, at `now`.
    ///
    /// # Errors
    /// [`Throttled`] with the wait, when either key is still waiting.
    pub async fn check(&self, user: &str, addr: IpAddr, now: Instant) -> Result<(), Throttled> {
        let user = if levee_agent::policy::check_name(user).is_ok() { user } else { "" };
        let st = self.state.lock().await;
        let wait = |f: Option<&Failures>| {
            f.filter(|f| f.fresh(now) && f.until > now).map(|f| f.until.saturating_duration_since(now))
        };
        if let Some(retry_after) = wait(st.addresses.get(&addr)) {
            return Err(Throttled { retry_after, by: ThrottledBy::Address });
        }
        if let Some(retry_after) = wait(st.pairs.get(&(user.to_string(), addr))) {
            return Err(Throttled { retry_after, by: ThrottledBy::AccountAndAddress });
        }
        Ok(())
    }

    /// Records a failed attempt of `user` from `addr` at `now`.
    pub async fn failed(&self, user: &str, addr: IpAddr, now: Instant) {
        let mut st = self.state.lock().await;
        bound(&mut st.pairs, now);
        bound(&mut st.addresses, now);
        let key = (user.to_string(), addr);
        let pair = Failures::fail(st.pairs.get(&key).copied(), now, LOGIN_FREE_FAILURES, LOGIN_MAX_DELAY);
        st.pairs.insert(key, pair);
        let a = Failures::fail(
            st.addresses.get(&addr).copied(),
            now,
            LOGIN_ADDRESS_FREE_FAILURES,
            LOGIN_MAX_DELAY,
        );
        st.addresses.insert(addr, a);
    }

    /// Clears the count of `user` from `addr` after a success.
    pub async fn succeeded(&self, user: &str, addr: IpAddr) {
        self.state.lock().await.pairs.remove(&(user.to_string(), addr));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn login_delays_grow_to_a_cap() {
        let d = |n| login_delay(n, LOGIN_FREE_FAILURES, LOGIN_MAX_DELAY).as_secs();
        let free = LOGIN_FREE_FAILURES;
        assert_eq!((d(0), d(free)), (0, 0));
        assert_eq!((d(free + 1), d(free + 2), d(free + 3), d(free + 4)), (1, 2, 4, 8));
        assert_eq!(d(free + 10), LOGIN_MAX_DELAY.as_secs());
        assert_eq!(d(u32::MAX), LOGIN_MAX_DELAY.as_secs());
    }

    /// SEC-1: wrong passwords for `admin` from one address make that address wait (growing,
    /// capped); `admin` from another address is never slowed; an attempt while waiting
    /// does not lengthen the wait, and after it the right password works even from the
    /// attacker's address. Spraying one address across usernames is limited too.
    #[tokio::test]
    async fn sec_1_throttle_per_account_and_address_never_locks_the_owner_out() {
        let l = LoginLimiter::default();
        let (attacker, owner) = (ip("203.0.113.66"), ip("198.51.100.7"));
        let t0 = Instant::now();
        let mut now = t0;
        for _ in 0..LOGIN_FREE_FAILURES {
            assert!(l.check("admin", attacker, now).await.is_ok());
            l.failed("admin", attacker, now).await;
        }
        assert!(l.check("admin", attacker, now).await.is_ok(), "the free failures cost nothing");
        // Keep guessing, each time as soon as allowed, for an hour.
        let mut waits = Vec::new();
        while now < t0 + Duration::from_secs(3600) {
            match l.check("admin", attacker, now).await {
                Ok(()) => l.failed("admin", attacker, now).await,
                Err(t) => {
                    assert!(t.retry_after <= LOGIN_MAX_DELAY, "never more than the cap: {t:?}");
                    // Hammering while waiting changes nothing.
                    for _ in 0..100 {
                        assert_eq!(l.check("admin", attacker, now).await, Err(t));
                    }
                    waits.push(t.retry_after);
                    now += t.retry_after;
                }
            }
            // The owner, from elsewhere, is never held up.
            assert!(l.check("admin", owner, now).await.is_ok());
        }
        assert_eq!(&waits[..4], &[1, 2, 4, 8].map(Duration::from_secs));
        assert_eq!(*waits.last().unwrap(), LOGIN_MAX_DELAY);
        // The owner logging in from the attacker's address after one wait: allowed, and a
        // success clears that pair's count.
        let wait = l.check("admin", attacker, now).await.err().map_or(Duration::ZERO, |t| t.retry_after);
        now += wait;
        assert!(l.check("admin", attacker, now).await.is_ok());
        l.succeeded("admin", attacker).await;
        l.failed("admin", attacker, now).await;
        // The pair's count was cleared by the success (one failure is free again); the
        // address keeps its own count (a valid account must not reset a sprayer's).
        assert_eq!(l.check("admin", attacker, now).await.map_err(|t| t.by), Err(ThrottledBy::Address));
        let fresh = ip("203.0.113.67");
        l.failed("admin", fresh, now).await;
        l.succeeded("admin", fresh).await;
        l.failed("admin", fresh, now).await;
        assert!(l.check("admin", fresh, now).await.is_ok());

        // Spraying: one wrong password each for many usernames from one address.
        let sprayer = ip("192.0.2.50");
        let mut first_wait = None;
        for i in 0..LOGIN_ADDRESS_FREE_FAILURES + 1 {
            let user = format!("user{i}");
            assert!(l.check(&user, sprayer, now).await.is_ok(), "attempt {i}");
            l.failed(&user, sprayer, now).await;
            first_wait = l.check("someone-else", sprayer, now).await.err();
        }
        let t = first_wait.expect("the address waits past its free failures");
        assert_eq!(t.by, ThrottledBy::Address);
        assert_eq!(t.retry_after, LOGIN_BASE_DELAY);
        assert!(l.check("someone-else", owner, now).await.is_ok(), "other addresses are not affected");

        // Forgotten after a quiet period.
        now += LOGIN_FORGET_AFTER;
        assert!(l.check("user0", sprayer, now).await.is_ok());
        l.failed("user0", sprayer, now).await;
        assert!(l.check("user1", sprayer, now).await.is_ok());
    }
}
