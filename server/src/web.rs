//! What the API and the UI share on the HTTP side: the state every handler gets, the
//! request id and the session cookie. Neither `api` nor `ui` is imported here, so both
//! depend on this module and never on each other.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use ipnet::IpNet;
use metrics_exporter_prometheus::PrometheusHandle;
use sha2::Digest;

use crate::actions::{Action, Actions, Actor, Forbidden, Via};
use crate::auth::{Keys, LoginLimiter, Principal};
use crate::db::{Reader, Role, Store};
use crate::hub::Hub;

/// Name of the UI session cookie (it holds the session JWT; the API reads it for safe
/// methods only).
pub const SESSION_COOKIE: &str = "levee_session";

/// What an edge needs to record a 403: the actions, the request's id, and its method and
/// path (the refusal's target). The API's `Auth` and the UI's `UiUser` refuse through it.
#[derive(Clone, Debug)]
pub struct Refusals {
    pub actions: Actions,
    pub request_id: String,
    pub target: String,
}

impl Refusals {
    /// `Ok` when `principal`'s role is at least `needed`; else the refusal of `attempted`
    /// (an action, a role, a page), audited and logged without waiting.
    pub fn check(
        &self,
        principal: &Principal,
        via: Via,
        needed: Role,
        attempted: &str,
    ) -> Result<(), Forbidden> {
        Forbidden::check(principal.role, needed)
            .inspect_err(|&f| self.record(Actor::new(principal, via, self.request_id.clone()), attempted, f))
    }

    /// `Ok` when `actor` may do `action`; else its refusal, audited and logged as an
    /// attempt at the action.
    pub fn may(&self, actor: &Actor, action: Action) -> Result<(), Forbidden> {
        actor.may(action).inspect_err(|&f| self.record(actor.clone(), action.name(), f))
    }

    fn record(&self, actor: Actor, attempted: &str, why: Forbidden) {
        self.actions.spawn_refused(actor, attempted.to_string(), self.target.clone(), why);
    }
}

/// Shared state of the HTTP side. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Everything the handlers read; they write only through `actions`.
    pub store: Reader,
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
    /// Proxies (addresses or CIDR ranges) whose `X-Forwarded-For` names the client and
    /// whose `X-Forwarded-Proto` is believed (`LEVEE_TRUSTED_PROXIES`); empty: the client
    /// is the socket peer, whatever the headers say.
    pub trusted_proxies: Arc<[IpNet]>,
    /// The bearer token `/metrics` asks for (`LEVEE_METRICS_TOKEN`); `None`: open.
    pub metrics_token: Option<MetricsToken>,
    /// The server's stop flag: set, the readiness probes answer 503 and long-lived
    /// responses (the live page's events, the agents' long polls) end at once.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// Agents' health reports of this replica, and the queries over every replica's.
    pub health: crate::health::Health,
    /// Experiments started on this replica run here.
    pub experiments: crate::experiments::Experiments,
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
        let replica = format!("replica-{}", uuid::Uuid::new_v4().simple());
        let health = crate::health::Health::spawn(store.clone(), &replica, crate::shutdown::never()).0;
        let actions = Actions::new(store.clone(), hub.clone(), keys.clone());
        AppState {
            experiments: crate::experiments::Experiments::new(
                store.clone(),
                actions.clone(),
                health.clone(),
                crate::shutdown::never(),
            ),
            health,
            actions,
            hub,
            store: store.reader(),
            keys,
            max_body_bytes,
            logins: Arc::default(),
            metrics,
            trusted_proxies: Arc::from([]),
            shutdown: crate::shutdown::never(),
            metrics_token: None,
        }
    }
}

/// The token `/metrics` asks for, kept as its SHA-256 digest: a comparison of digests
/// tells an attacker nothing about the token through its timing, and the value never
/// prints.
#[derive(Clone)]
pub struct MetricsToken([u8; 32]);

impl MetricsToken {
    /// The token `token`.
    pub fn new(token: &str) -> MetricsToken {
        MetricsToken(sha2::Sha256::digest(token.as_bytes()).into())
    }

    /// Whether `given` is the token.
    pub fn matches(&self, given: &str) -> bool {
        <[u8; 32]>::from(sha2::Sha256::digest(given.as_bytes())) == self.0
    }
}

impl std::fmt::Debug for MetricsToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsToken(***)")
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

/// The client's address: the socket peer, or, when the peer is in the trusted proxies'
/// ranges ([`AppState::trusted_proxies`]), the right-most `X-Forwarded-For` entry that is
/// not a trusted proxy itself. `0.0.0.0` when the request came without a socket (router tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientAddr(pub IpAddr);

impl ClientAddr {
    /// The client of a request with `peer` as its socket peer.
    pub fn of(peer: Option<IpAddr>, headers: &HeaderMap, trusted: &[IpNet]) -> ClientAddr {
        let Some(peer) = peer else { return ClientAddr(IpAddr::V4(Ipv4Addr::UNSPECIFIED)) };
        let peer = peer.to_canonical();
        if !is_trusted(trusted, peer) {
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
                Ok(ip) if is_trusted(trusted, ip) => continue,
                Ok(ip) => return ClientAddr(ip.to_canonical()),
                // Garbage from further out than our proxies: the last proxy's word is all we have.
                Err(_) => break,
            }
        }
        ClientAddr(peer)
    }
}

/// Marks every request of the listener this server terminates TLS on (the app's TLS
/// branch adds it as an extension), whatever the HTTP version: an HTTP/1.1 request URI
/// carries no scheme, so the connection is what says it.
#[derive(Clone, Copy, Debug)]
pub struct OverTls;

/// Whether the client reached us over HTTPS: a connection this server terminated TLS on,
/// or a trusted proxy ([`AppState::trusted_proxies`]) saying `https` first in
/// `X-Forwarded-Proto` (anyone else's header is ignored). Decides the cookies' `Secure`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Https(pub bool);

impl Https {
    /// The rule, for a request with `peer` as its socket peer.
    pub fn of(over_tls: bool, peer: Option<IpAddr>, headers: &HeaderMap, trusted: &[IpNet]) -> Https {
        let proxy_says = || {
            headers
                .get("x-forwarded-proto")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(',').next())
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
        };
        Https(over_tls || (peer.is_some_and(|p| is_trusted(trusted, p)) && proxy_says()))
    }
}

impl FromRequestParts<AppState> for Https {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
        let tls = parts.extensions.get::<OverTls>().is_some();
        Ok(Https::of(tls, peer, &parts.headers, &state.trusted_proxies))
    }
}

/// Whether `ip` is in one of the trusted ranges (an IPv4 peer seen as `::ffff:a.b.c.d` on a
/// dual-stack socket counts as its IPv4 address).
pub fn is_trusted(trusted: &[IpNet], ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    trusted.iter().any(|n| n.contains(&ip))
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
        let proxies: Vec<IpNet> = vec!["10.0.0.1/32".parse().unwrap(), "10.0.0.2/32".parse().unwrap()];
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

    #[test]
    fn trusted_proxies_are_ranges() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "203.0.113.9, 10.1.2.3".parse().unwrap());
        let pods: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        // The peer and the inner hop are both in the pod range: the client is the next hop out.
        let peer: IpAddr = "10.244.1.7".parse().unwrap();
        assert_eq!(ClientAddr::of(Some(peer), &h, &pods).0, "203.0.113.9".parse::<IpAddr>().unwrap());
        // A dual-stack socket shows an IPv4 proxy as ::ffff:a.b.c.d: still the same proxy.
        let mapped: IpAddr = "::ffff:10.244.1.7".parse().unwrap();
        assert_eq!(ClientAddr::of(Some(mapped), &h, &pods).0, "203.0.113.9".parse::<IpAddr>().unwrap());
        // Outside the range: the peer itself.
        let outside: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(ClientAddr::of(Some(outside), &h, &pods).0, outside);
    }

    #[test]
    fn https_is_the_connection_or_a_trusted_proxys_word() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-proto", "https".parse().unwrap());
        let proxy: IpAddr = "10.0.0.1".parse().unwrap();
        let client: IpAddr = "192.0.2.1".parse().unwrap();
        let trusted: Vec<IpNet> = vec!["10.0.0.0/24".parse().unwrap()];
        // Our own TLS, any HTTP version, no header needed.
        assert_eq!(Https::of(true, Some(client), &HeaderMap::new(), &[]), Https(true));
        // A trusted proxy's header counts; anyone else's does not.
        assert_eq!(Https::of(false, Some(proxy), &h, &trusted), Https(true));
        assert_eq!(Https::of(false, Some(client), &h, &trusted), Https(false));
        assert_eq!(Https::of(false, Some(proxy), &h, &[]), Https(false));
        // Plain HTTP from a trusted proxy that says http.
        let mut plain = HeaderMap::new();
        plain.insert("x-forwarded-proto", "http".parse().unwrap());
        assert_eq!(Https::of(false, Some(proxy), &plain, &trusted), Https(false));
    }
}

/// A row an environment's path names by its id (`/environments/{env}/change-requests/{id}`).
pub trait OfEnvironment {
    /// What it is, in words (`change request`).
    const WHAT: &'static str;
    /// The environment it belongs to.
    fn environment(&self) -> &str;
}

impl OfEnvironment for crate::db::RequestRow {
    const WHAT: &'static str = "change request";
    fn environment(&self) -> &str {
        &self.environment
    }
}

impl OfEnvironment for crate::db::ScheduledRow {
    const WHAT: &'static str = "scheduled change";
    fn environment(&self) -> &str {
        &self.environment
    }
}

impl OfEnvironment for crate::db::ExperimentRow {
    const WHAT: &'static str = "experiment";
    fn environment(&self) -> &str {
        &self.environment
    }
}

/// An id asked under the path of an environment it does not belong to (or of none): the
/// API and the UI answer it as not found.
#[derive(Debug, thiserror::Error)]
#[error("no {what} {id} in environment {env:?}")]
pub struct NotInEnvironment {
    what: &'static str,
    id: i64,
    env: String,
}

/// `row` (read by `id`) when it belongs to environment `env`. Under another environment's
/// path an id is answered as one that does not exist, so a path never reads or changes
/// another environment's rows, nor says that they exist.
///
/// # Errors
/// [`NotInEnvironment`] when there is no row, or it belongs to another environment.
pub fn of_environment<T: OfEnvironment>(row: Option<T>, env: &str, id: i64) -> Result<T, NotInEnvironment> {
    row.filter(|r| r.environment() == env).ok_or_else(|| NotInEnvironment {
        what: T::WHAT,
        id,
        env: env.to_string(),
    })
}
