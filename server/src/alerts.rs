//! Features living on a fallback longer than their degradation-matrix row's `alert_after`:
//! every [`ALERT_CHECK_INTERVAL`] the server reads each service's policy and its connected
//! agents' reports ([`advice::features_past_alert`], the one statement of the rule), keeps
//! the gauge [`PAST_ALERT_GAUGE`] `{environment, service, feature}` at 1 while a feature is
//! past it (0 after), and, when `alert_webhook_url` is set, POSTs one JSON document per
//! transition ([`AlertEvent`]), retried with exponential backoff ([`WEBHOOK_ATTEMPTS`]).

use std::collections::BTreeMap;
use std::time::Duration;

use levee_agent::policy::Timestamp;
use serde::Serialize;
use tokio::sync::watch;

use crate::advice::{self, PastAlert};
use crate::db::Store;
use crate::shutdown::stopped;

/// How often the server looks for features past their `alert_after`.
pub const ALERT_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// Gauge: 1 while a feature has been on its fallback past its row's `alert_after`, else 0.
pub const PAST_ALERT_GAUGE: &str = "levee_server_feature_fallback_past_alert";
/// Counter of webhook deliveries that failed after every attempt.
pub const WEBHOOK_FAILURES: &str = "levee_server_alert_webhook_failures_total";
/// Attempts of one webhook POST.
pub const WEBHOOK_ATTEMPTS: u32 = 5;
/// Wait before the second attempt; doubles after each failure.
pub const WEBHOOK_FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Timeout of one attempt.
pub const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);

/// Which way a feature crossed its row's `alert_after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum FallbackAlert {
    /// It has been on its fallback longer than `alert_after`.
    #[serde(rename = "fallback_past_alert_after")]
    Past,
    /// It no longer is.
    #[serde(rename = "fallback_alert_resolved")]
    Resolved,
}

impl FallbackAlert {
    /// The event's name, as the webhook's JSON spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            FallbackAlert::Past => "fallback_past_alert_after",
            FallbackAlert::Resolved => "fallback_alert_resolved",
        }
    }
}

/// One transition, as POSTed to the webhook.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AlertEvent {
    /// `fallback_past_alert_after` (it started) or `fallback_alert_resolved` (it ended).
    pub event: FallbackAlert,
    pub environment: String,
    pub service: String,
    /// The feature, as its matrix row names it.
    pub feature: String,
    /// Level of its fallback when it crossed (`GENERIC`, …); empty when resolved.
    pub level: String,
    /// When the feature went onto its fallback (RFC 3339); absent when resolved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// The row's threshold, as the policy writes durations.
    pub alert_after: String,
    /// When the server saw the transition (RFC 3339).
    pub at: String,
}

type Key = (String, String, String);

/// The watcher's memory: which features are past their threshold now.
#[derive(Debug, Default)]
pub struct AlertWatcher {
    active: BTreeMap<Key, PastAlert>,
}

impl AlertWatcher {
    /// Reads every service and returns the transitions since the last check (the gauge is
    /// updated by [`AlertWatcher::publish`]).
    ///
    /// # Errors
    /// The database failed; nothing is changed then.
    pub async fn check(&mut self, store: &Store, now: Timestamp) -> anyhow::Result<Vec<AlertEvent>> {
        let mut found: BTreeMap<Key, PastAlert> = BTreeMap::new();
        for env in store.environments().await? {
            for svc in store.services(&env.name).await? {
                let Some(Ok(cfg)) = store.latest_snapshot(&env.name, &svc.name).await?.map(|s| s.config())
                else {
                    continue;
                };
                if cfg.policy.degradation_matrix.is_empty() {
                    continue;
                }
                let agents = store.agents(&env.name, &svc.name).await?;
                for p in advice::features_past_alert(&cfg.policy, &agents, now) {
                    found.insert((env.name.clone(), svc.name.clone(), p.feature.clone()), p);
                }
            }
        }
        let at = now.to_rfc3339();
        let mut events = Vec::new();
        for (k, p) in &found {
            if !self.active.contains_key(k) {
                events.push(AlertEvent {
                    event: FallbackAlert::Past,
                    environment: k.0.clone(),
                    service: k.1.clone(),
                    feature: k.2.clone(),
                    level: p.level.clone(),
                    since: Some(p.since.to_rfc3339()),
                    alert_after: levee_agent::policy::duration::format(p.alert_after),
                    at: at.clone(),
                });
            }
        }
        for (k, p) in &self.active {
            if !found.contains_key(k) {
                events.push(AlertEvent {
                    event: FallbackAlert::Resolved,
                    environment: k.0.clone(),
                    service: k.1.clone(),
                    feature: k.2.clone(),
                    level: String::new(),
                    since: None,
                    alert_after: levee_agent::policy::duration::format(p.alert_after),
                    at: at.clone(),
                });
            }
        }
        self.active = found;
        Ok(events)
    }

    /// Sets the gauge of every transition in `events` (1 past, 0 resolved).
    pub fn publish(events: &[AlertEvent]) {
        for e in events {
            let value = if e.event == FallbackAlert::Past { 1.0 } else { 0.0 };
            metrics::gauge!(PAST_ALERT_GAUGE, "environment" => e.environment.clone(),
                "service" => e.service.clone(), "feature" => e.feature.clone())
            .set(value);
        }
    }
}

/// What a webhook's log lines name about an event.
pub trait Eventful {
    /// The event and what it is about, in words.
    fn subject(&self) -> String;
}

impl Eventful for AlertEvent {
    fn subject(&self) -> String {
        format!("{} {}/{} feature {:?}", self.event.as_str(), self.environment, self.service, self.feature)
    }
}

impl Eventful for crate::actions::Halted {
    fn subject(&self) -> String {
        format!("{} {}/{} rollout {}", self.event, self.environment, self.service, self.rollout)
    }
}

/// POSTs `event` as JSON to `url`, retrying a failure (no answer, or not 2xx) up to
/// [`WEBHOOK_ATTEMPTS`] times with a doubling wait. Returns whether it was delivered.
pub async fn deliver<E: Serialize + Eventful>(client: &reqwest::Client, url: &str, event: &E) -> bool {
    let mut wait = WEBHOOK_FIRST_BACKOFF;
    for attempt in 1..=WEBHOOK_ATTEMPTS {
        match client.post(url).timeout(WEBHOOK_TIMEOUT).json(event).send().await {
            Ok(r) if r.status().is_success() => return true,
            Ok(r) => {
                tracing::warn!(status = r.status().as_u16(), attempt, subject = %event.subject(), "alert webhook refused")
            }
            Err(e) => {
                // Without the URL: a chat webhook's URL is its secret.
                let e = e.without_url();
                tracing::warn!(error = %e, attempt, subject = %event.subject(), "alert webhook unreachable")
            }
        }
        if attempt < WEBHOOK_ATTEMPTS {
            tokio::time::sleep(wait).await;
            wait *= 2;
        }
    }
    metrics::counter!(WEBHOOK_FAILURES).increment(1);
    tracing::error!(subject = %event.subject(), "alert webhook not delivered after every attempt");
    false
}

/// Checks every [`ALERT_CHECK_INTERVAL`] until `shutdown`, publishing the gauge and
/// delivering each transition to `webhook` (each delivery on its own task, so a slow
/// receiver never delays the next check).
pub async fn run(store: Store, webhook: Option<String>, mut shutdown: watch::Receiver<bool>) {
    let client = reqwest::Client::new();
    let mut watcher = AlertWatcher::default();
    let mut tick = tokio::time::interval(ALERT_CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped(&mut shutdown) => return,
        }
        let events = match watcher.check(&store, Timestamp::now()).await {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %levee_agent::report::ErrorChain(e.as_ref()), "checking alert_after");
                continue;
            }
        };
        AlertWatcher::publish(&events);
        for e in events {
            tracing::warn!(event = e.event.as_str(), environment = ?e.environment, service = ?e.service,
                feature = ?e.feature, since = ?e.since, "feature fallback alert");
            if let Some(url) = webhook.clone() {
                let client = client.clone();
                tokio::spawn(async move { deliver(&client, &url, &e).await });
            }
        }
    }
}
