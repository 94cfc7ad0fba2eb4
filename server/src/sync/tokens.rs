//! Agent tokens the database verified recently, trusted from memory while it is away.

use std::collections::HashMap;
use std::time::Duration;

use crate::auth::AgentPrincipal;

/// How long a verified agent token is trusted from memory while the database cannot be
/// read (a token revoked meanwhile could only have been revoked while it was reachable,
/// and a stream it opened ends at its maximum age).
pub const VERIFIED_TOKEN_TTL: Duration = Duration::from_secs(15 * 60);
/// Most tokens remembered as verified (past it the oldest half is forgotten).
pub const VERIFIED_TOKENS_MAX: usize = 100_000;

/// Agent tokens verified against the database recently: while it is away, a stream
/// presenting one of them is accepted from memory (its signature and expiry are still
/// checked, and the end of a rotation's overlap it was verified with) instead of being
/// refused.
#[derive(Debug, Default)]
pub(super) struct VerifiedTokens {
    map: tokio::sync::Mutex<HashMap<String, (AgentPrincipal, tokio::time::Instant)>>,
}

impl VerifiedTokens {
    pub(super) async fn remember(&self, p: &AgentPrincipal) {
        let mut m = self.map.lock().await;
        if m.len() >= VERIFIED_TOKENS_MAX {
            let mut ages: Vec<_> = m.values().map(|(_, at)| *at).collect();
            ages.sort();
            let cut = ages[ages.len() / 2];
            m.retain(|_, (_, at)| *at > cut);
        }
        m.insert(p.jti.clone(), (p.clone(), tokio::time::Instant::now()));
    }

    pub(super) async fn forget(&self, jti: &str) {
        self.map.lock().await.remove(jti);
    }

    pub(super) async fn recent(&self, jti: &str) -> Option<AgentPrincipal> {
        let m = self.map.lock().await;
        let now = crate::db::now_ms();
        m.get(jti)
            .filter(|(p, at)| at.elapsed() < VERIFIED_TOKEN_TTL && !crate::db::revoked(p.revoked_at, now))
            .map(|(p, _)| p.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(jti: &str, revoked_at: Option<i64>) -> AgentPrincipal {
        AgentPrincipal {
            name: "checkout-prod".into(),
            environment: "prod".into(),
            services: vec!["checkout".into()],
            jti: jti.into(),
            revoked_at,
        }
    }

    /// While the database is away a verified token is trusted from memory for
    /// `VERIFIED_TOKEN_TTL`, but never past the end of a rotation's overlap it was
    /// verified with.
    #[tokio::test(start_paused = true)]
    async fn memory_keeps_a_token_until_its_ttl_or_its_rotation_end() {
        let v = VerifiedTokens::default();
        let now = crate::db::now_ms();
        v.remember(&principal("plain", None)).await;
        v.remember(&principal("rotated-later", Some(now + 3_600_000))).await;
        v.remember(&principal("rotated-ended", Some(now - 1))).await;
        assert!(v.recent("plain").await.is_some());
        assert!(v.recent("rotated-later").await.is_some());
        assert!(v.recent("rotated-ended").await.is_none(), "its overlap is over");
        tokio::time::advance(VERIFIED_TOKEN_TTL).await;
        assert!(v.recent("plain").await.is_none(), "remembered no longer than the TTL");
    }
}
