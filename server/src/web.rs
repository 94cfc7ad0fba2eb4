//! What the API and the UI share on the HTTP side: the state every handler gets, the
//! request id and the session cookie. Neither `api` nor `ui` is imported here, so both
//! depend on this module and never on each other.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::actions::Actions;
use crate::auth::{Keys, LoginLimiter};
use crate::db::Store;
use crate::hub::Hub;

/// Name of the UI session cookie (it holds the session JWT; the API reads it for safe
/// methods only).
pub const SESSION_COOKIE: &str = "levee_session";

/// Shared state of the HTTP side. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Everything the handlers read.
    pub store: Store,
    /// Every audited write.
    pub actions: Actions,
    /// Verifies tokens and signs sessions and anti-CSRF tokens.
    pub keys: Keys,
    /// Largest request body accepted, in bytes (`LEVEE_MAX_BODY_BYTES`).
    pub max_body_bytes: usize,
    /// Failed logins per username.
    pub logins: Arc<LoginLimiter>,
    /// Renders `/metrics`; `None` when another recorder is installed in this process.
    pub metrics: Option<PrometheusHandle>,
    /// This replica's newest snapshots (the agents' HTTP fallback long-polls it).
    pub hub: Hub,
    /// Proxies whose `X-Forwarded-For` names the client (`LEVEE_TRUSTED_PROXIES`); empty:
    /// the client is the socket peer, whatever the headers say.
    pub trusted_proxies: Arc<[IpAddr]>,
}

impl AppState {
    /// The state over `store`, whose writes publish to `hub`.
    pub fn new(
        store: Store,
        keys: Keys,
        hub: Hub,
        max_body_bytes: usize,
        metrics: Option<PrometheusHandle>,
    ) -> AppState {
        AppState {
            actions: Actions::new(store.clone(), hub.clone(), keys.clone()),
            hub,
            store,
            keys,
            max_body_bytes,
            logins: Arc::default(),
            metrics,
            trusted_proxies: Arc::from([]),
        }
    }
}

/// The request id set by the request-id layer (`x-request-id`, at most 64 characters), for
/// the audit log; empty when there is none.
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for RequestId {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let id = parts
            .headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .chars()
            .take(64)
            .collect();
        Ok(RequestId(id))
    }
}

/// The client's address: the socket peer, or, when the peer is one of the trusted proxies
/// ([`AppState::trusted_proxies`]), the right-most `X-Forwarded-For` entry that is not a
/// trusted proxy itself. `0.0.0.0` when the request came without a socket (router tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientAddr(pub IpAddr);

impl ClientAddr {
    /// The client of a request with `peer` as its socket peer.
    pub fn of(peer: Option<IpAddr>, headers: &HeaderMap, trusted: &[IpAddr]) -> ClientAddr {
        let Some(peer) = peer else { return ClientAddr(IpAddr::V4(Ipv4Addr::UNSPECIFIED)) };
        if !trusted.contains(&peer) {
            return ClientAddr(peer);
        }
        let forwarded = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect::<Vec<_>>();
        for hop in forwarded.iter().rev() {
            match hop.parse::<IpAddr>() {
                Ok(ip) if trusted.contains(&ip) => continue,
                Ok(ip) => return ClientAddr(ip),
                // Garbage from further out than our proxies: the last proxy's word is all we have.
                Err(_) => break,
            }
        }
        ClientAddr(peer)
    }
}

impl FromRequestParts<AppState> for ClientAddr {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
        Ok(ClientAddr::of(peer, &parts.headers, &state.trusted_proxies))
    }
}

/// The value of cookie `name` in the request headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_for_counts_only_from_a_trusted_proxy() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "203.0.113.9, 198.51.100.7, 10.0.0.2".parse().unwrap());
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let proxies: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        // Nobody trusted: the socket peer, whatever the header says.
        assert_eq!(ClientAddr::of(Some(peer), &h, &[]).0, peer);
        // Trusted chain: the right-most hop that is not one of ours (the left-most is the
        // client's own claim and could be anything).
        assert_eq!(ClientAddr::of(Some(peer), &h, &proxies).0, "198.51.100.7".parse::<IpAddr>().unwrap());
        // An untrusted peer sending the header changes nothing.
        let other: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(ClientAddr::of(Some(other), &h, &proxies).0, other);
        assert_eq!(ClientAddr::of(None, &h, &proxies).0, IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    }
}
