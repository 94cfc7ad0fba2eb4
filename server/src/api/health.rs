//! Agents' health per revision and subject (`crate::health`).

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use levee_agent::health::LATENCY_BOUNDS_MS;
use levee_agent::policy::Timestamp;
use serde::{Deserialize, Serialize};

use super::{ApiError, ApiQuery, ApiResult, Auth};
use crate::db::now_ms;
use crate::health::{HealthTotals, RETENTION, SubjectKind};
use crate::web::AppState;

/// How far back `GET .../health` looks without `since`, in ms.
pub const DEFAULT_HEALTH_RANGE_MS: i64 = 5 * 60 * 1000;

/// Parameters of `GET .../health`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct HealthQuery {
    /// Windows reported at or after this time (RFC 3339); default five minutes ago, at
    /// most 24 hours ago (the retention).
    #[param(value_type = Option<String>, format = DateTime)]
    pub since: Option<Timestamp>,
}

/// Totals with the figures derived from them.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct HealthFigures {
    /// The counts.
    pub totals: HealthTotals,
    /// `(failures + timeouts) / (successes + failures + timeouts)`, 0..1.
    pub error_rate: f64,
    /// `shed / calls`, 0..1.
    pub shed_rate: f64,
    /// Median latency (a duration, `"5ms"`): the upper bound of its bucket; absent without
    /// measured calls.
    #[serde(with = "levee_agent::policy::duration::option")]
    #[schema(value_type = Option<String>, example = "5ms")]
    pub p50: Option<Duration>,
    /// 99th percentile latency, as `p50`.
    #[serde(with = "levee_agent::policy::duration::option")]
    #[schema(value_type = Option<String>, example = "100ms")]
    pub p99: Option<Duration>,
}

/// A latency bucket's upper bound (whole milliseconds) as a duration.
fn bound(ms: f64) -> Duration {
    Duration::from_millis(ms as u64)
}

impl From<HealthTotals> for HealthFigures {
    fn from(totals: HealthTotals) -> Self {
        HealthFigures {
            error_rate: totals.error_rate(),
            shed_rate: totals.shed_rate(),
            p50: totals.p50_ms().map(bound),
            p99: totals.p99_ms().map(bound),
            totals,
        }
    }
}

/// One dependency's or route's health on one revision.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SubjectHealth {
    /// `dependency` or `route`.
    pub kind: SubjectKind,
    /// The dependency's name or the route's template, as the agents reported it.
    pub name: String,
    /// Its figures.
    #[serde(flatten)]
    pub figures: HealthFigures,
}

/// The health of the agents on one revision.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RevisionHealth {
    /// The revision the agents had applied when they reported.
    pub revision: u64,
    /// Instances that reported: the most in one 10-second slot of the range.
    pub instances: u64,
    /// Of those, the most that said they were not ready in one slot.
    pub not_ready: u64,
    /// Every outgoing dependency together.
    pub dependencies: HealthFigures,
    /// Every inbound route together.
    pub routes: HealthFigures,
    /// Per dependency and route, dependencies first, by name.
    pub subjects: Vec<SubjectHealth>,
}

/// A service's health since a time, per revision.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ServiceHealth {
    /// The environment.
    pub environment: String,
    /// The service.
    pub service: String,
    /// Start of the range: windows of 10-second slots ending after it count.
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub since: i64,
    /// Upper bounds of the latency buckets (durations, `"1ms"` to `"5s"`); one more bucket
    /// counts the calls past the last.
    #[schema(example = json!(["1ms", "2ms", "5ms"]))]
    pub latency_bounds: Vec<String>,
    /// Per revision, oldest first.
    pub revisions: Vec<RevisionHealth>,
}

/// The agents' health per revision of a service: calls and their outcomes (successes,
/// failures, timeouts, shed), fallbacks, breaker opens and latency per dependency and
/// inbound route, as the agents reported them, summed over every replica.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/health", tag = "fleet",
    params(("env" = String, Path), ("svc" = String, Path), HealthQuery),
    responses((status = 200, body = ServiceHealth), (status = 400, body = super::Problem),
        (status = 404, body = super::Problem)))]
pub async fn get(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<HealthQuery>,
) -> ApiResult<Json<ServiceHealth>> {
    let now = now_ms();
    let oldest = now - RETENTION.as_millis() as i64;
    let since = match q.since {
        None => now - DEFAULT_HEALTH_RANGE_MS,
        Some(t) if (oldest..=now).contains(&t.unix_ms()) => t.unix_ms(),
        Some(t) => {
            return Err(ApiError::bad_field(
                "since",
                t.to_rfc3339(),
                format!(
                    "must be between {} (24 hours ago, the retention) and now",
                    Timestamp::from_unix_ms(oldest).to_rfc3339()
                ),
            ));
        }
    };
    super::services::service_or_404(&s, &env, &svc).await?;
    let revisions = s
        .health
        .by_revision_and_subject(&env, &svc, since)
        .await?
        .into_iter()
        .map(|(revision, all)| {
            let subjects = all.subjects;
            let mut dependencies = HealthTotals::default();
            let mut routes = HealthTotals::default();
            for ((kind, _), t) in &subjects {
                match kind {
                    SubjectKind::Dependency => dependencies.add(t),
                    SubjectKind::Route => routes.add(t),
                }
            }
            RevisionHealth {
                revision,
                instances: all.instances,
                not_ready: all.not_ready,
                dependencies: dependencies.into(),
                routes: routes.into(),
                subjects: subjects
                    .into_iter()
                    .map(|((kind, name), t)| SubjectHealth { kind, name, figures: t.into() })
                    .collect(),
            }
        })
        .collect();
    Ok(Json(ServiceHealth {
        environment: env,
        service: svc,
        since,
        latency_bounds: LATENCY_BOUNDS_MS
            .iter()
            .map(|&ms| levee_agent::policy::duration::format(Duration::from_millis(ms)))
            .collect(),
        revisions,
    }))
}
