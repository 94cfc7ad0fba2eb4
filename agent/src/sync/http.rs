//! The HTTP fallback of the sync client, for places where gRPC is blocked: after
//! `http_fallback_after` stream attempts in a row failed, the client long-polls
//! `GET {http_fallback}/api/v1/sync/{env}/{service}` (same token, same scope) with
//! `If-None-Match: "<applied revision>"` for `http_fallback_period`, applying each newer
//! snapshot exactly as the stream does (judge, apply, persist), then tries the stream
//! again.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use prost::Message;
use tokio::time::{Instant, sleep};

use super::apply::{Verdict, judge};
use super::{Ended, ReconnectBackoff, SyncClient};
use crate::policy::Timestamp;
use crate::policy::defaults::MAX_MESSAGE_BYTES;
use crate::proto::Snapshot;

/// One long-poll's outcome.
enum Polled {
    /// A newer snapshot.
    Snapshot(Box<Snapshot>),
    /// Nothing newer within the wait.
    NotModified,
    /// The server refused the token (401 / 403).
    Unauthorized(String),
    /// Anything else.
    Failed(String),
}

impl SyncClient {
    /// Polls over HTTP for `http_fallback_period` (or until shutdown / a refused token).
    /// Returns `Some(Ended::…)` when the client must stop or back off for authorization,
    /// `None` when the period is over and the stream should be tried again.
    pub(super) async fn poll_http(&self, base: &str) -> Option<Ended> {
        let client: Client<HttpConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let until = Instant::now() + self.settings.http_fallback_period;
        let mut backoff = ReconnectBackoff::new(&self.settings);
        tracing::warn!(
            environment = %self.shared.environment,
            service = %self.shared.service,
            url = %base,
            "levee sync stream keeps failing; polling the server over HTTP"
        );
        let mut shutdown = self.shutdown.clone();
        while Instant::now() < until {
            let polled = tokio::select! {
                p = self.poll_once(&client, base) => p,
                _ = shutdown.changed() => return Some(Ended::Shutdown),
            };
            match polled {
                Polled::Snapshot(snap) => {
                    backoff.reset();
                    self.apply_polled(*snap).await;
                }
                Polled::NotModified => {
                    backoff.reset();
                    self.shared.confirm(self.shared.current.load().revision);
                }
                Polled::Unauthorized(e) => return Some(Ended::Unauthorized(e)),
                Polled::Failed(e) => {
                    tracing::debug!(error = %e, "HTTP poll failed");
                    self.shared.set_error(e);
                    tokio::select! {
                        _ = sleep(backoff.next_delay()) => {}
                        _ = shutdown.changed() => return Some(Ended::Shutdown),
                    }
                }
            }
        }
        None
    }

    async fn poll_once(&self, client: &Client<HttpConnector, Empty<Bytes>>, base: &str) -> Polled {
        let wait = self.settings.http_long_poll;
        let uri = format!(
            "{}/api/v1/sync/{}/{}?wait={}ms",
            base.trim_end_matches('/'),
            self.shared.environment,
            self.shared.service,
            wait.as_millis()
        );
        let have = self.shared.current.load().revision;
        let req = match http::Request::get(&uri)
            .header(http::header::AUTHORIZATION, self.token.header().as_bytes())
            .header(http::header::IF_NONE_MATCH, format!("\"{have}\""))
            .header(http::header::USER_AGENT, concat!("levee-agent/", env!("CARGO_PKG_VERSION")))
            .body(Empty::new())
        {
            Ok(r) => r,
            Err(e) => return Polled::Failed(format!("bad HTTP fallback URL {uri}: {e}")),
        };
        let limit = wait + self.settings.connect_timeout + Duration::from_secs(5);
        let res = match tokio::time::timeout(limit, client.request(req)).await {
            Ok(Ok(res)) => res,
            Ok(Err(e)) => return Polled::Failed(format!("HTTP poll of {uri} failed: {e}")),
            Err(_) => return Polled::Failed(format!("HTTP poll of {uri} timed out")),
        };
        let status = res.status();
        // The stream's message limit holds here too.
        let body = Limited::new(res.into_body(), MAX_MESSAGE_BYTES);
        let body = match tokio::time::timeout(limit, body.collect()).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(e)) if e.is::<LengthLimitError>() => {
                return Polled::Failed(format!(
                    "the HTTP poll answer of {uri} is larger than {MAX_MESSAGE_BYTES} bytes, the most this agent receives"
                ));
            }
            _ => return Polled::Failed(format!("reading the HTTP poll answer of {uri} failed")),
        };
        match status.as_u16() {
            200 => match Snapshot::decode(body) {
                Ok(s) => Polled::Snapshot(Box::new(s)),
                Err(e) => Polled::Failed(format!("the HTTP poll answer is not a snapshot: {e}")),
            },
            304 => Polled::NotModified,
            401 | 403 => Polled::Unauthorized(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&body).chars().take(300).collect::<String>()
            )),
            _ => Polled::Failed(format!("HTTP poll answered {status}")),
        }
    }

    /// Judges and applies a polled snapshot as the stream does, persisting it before the
    /// next poll (there is no ACK over HTTP; the next stream's Hello reports it).
    async fn apply_polled(&self, snap: Snapshot) {
        let revision = snap.revision;
        match judge(&self.shared, &snap, Instant::now(), Timestamp::now()) {
            Verdict::Apply(applied) => {
                let (body, hash) = (applied.body.clone(), applied.hash.clone());
                self.shared.install_live(applied);
                tracing::info!(service = %snap.service, revision, "levee configuration applied (HTTP fallback)");
                if let (Some(body), Some(cache)) = (body, self.shared.cache.clone()) {
                    let _ = tokio::task::spawn_blocking(move || {
                        cache.store(revision, &hash, &body, Timestamp::now()).map(|_| ())
                    })
                    .await;
                }
            }
            Verdict::AlreadyApplied => {
                self.shared.confirm(revision);
            }
            Verdict::Reject(detail) => {
                tracing::warn!(revision, reason = %detail, "levee snapshot rejected; keeping the last good configuration");
                self.shared.set_nack(revision, detail);
            }
        }
    }
}
