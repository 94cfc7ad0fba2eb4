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
/// checked) instead of being refused.
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
        m.get(jti).filter(|(_, at)| at.elapsed() < VERIFIED_TOKEN_TTL).map(|(p, _)| p.clone())
    }
}
