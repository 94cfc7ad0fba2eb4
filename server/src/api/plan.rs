//! `POST /api/v1/plan`: what applying a set of manifests would do, service by service,
//! with the server's advice on each resulting policy. `levee apply` shows it before it
//! writes, and writes only with the revisions it reports (`If-Match`).

use std::collections::{BTreeMap, BTreeSet};

use axum::Json;
use axum::extract::State;
use levee_agent::policy::{FieldError, Flag, Lint, Policy, ServiceConfig, Timestamp, ValidationErrors};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{ApiError, ApiJson, ApiResult, Auth};
use crate::actions::flags::over_temporary;
use crate::actions::{ProfileUndo, profile_flag_keys, profile_undo};
use crate::advice;
use crate::diff::{DiffEntry, json_diff};
use crate::manifest::ServiceManifest;
use crate::web::AppState;

/// Most manifests in one plan.
pub const MAX_PLAN_SERVICES: usize = 500;

/// Body of `POST /plan`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanRequest {
    /// The services as they should be (the manifest shape of `levee apply`); each
    /// environment named must exist.
    pub manifests: Vec<ServiceManifest>,
    /// Whether services of those environments that no manifest names are to be deleted
    /// (`prune`); otherwise they are listed as `unmanaged`.
    #[serde(default)]
    pub prune: bool,
}

/// What applying would do to one service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PlanAction {
    /// It does not exist: it would be created.
    Create,
    /// It exists and differs: `changes` lists every difference.
    Change,
    /// It exists and is as the manifest says.
    Unchanged,
    /// No manifest names it and `prune` was asked: it would be deleted.
    Prune,
    /// No manifest names it; without `prune` it is left alone.
    Unmanaged,
}

/// One service of a plan.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct PlanEntry {
    pub environment: String,
    pub service: String,
    pub action: PlanAction,
    /// The revision the plan compared with: send it as `If-Match` with the write, so a
    /// change made since the plan is refused (409) instead of overwritten. Absent for
    /// `create`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// For `change`: every difference from the service as stored to the manifest, by
    /// path (`policy.dependencies.pricing.attempt_timeout`, `flags.x.value`,
    /// `description`). Empty otherwise.
    pub changes: Vec<DiffEntry>,
    /// The server's advice on the policy the service would have (none for `prune`).
    pub lints: Vec<Lint>,
    /// The emergency profile active in the environment, when it covers this service, with
    /// `undoes`: the flags it set that this plan's changes (or the deletion of the service,
    /// for `prune`) would undo. The write of such a service is refused (409
    /// `profile-would-undo`) unless it sends `override_profile` (`levee apply
    /// --override-profile`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileUndo>,
    /// Flags under a temporary value (`levee flip --for`) that the manifest declares: the
    /// write keeps the temporary value until its expiry, and what the manifest declares is
    /// what the flag goes back to then. So an apply during an incident never switches a
    /// flipped kill switch back.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub temporary: Vec<TemporaryFlag>,
}

/// A flag that keeps its temporary value through a write (see [`PlanEntry::temporary`]).
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct TemporaryFlag {
    /// The flag's key.
    pub key: String,
    /// The value in force until `expires_at` (of the flag's type).
    #[schema(value_type = Value)]
    pub value: serde_json::Value,
    /// When the temporary value ends.
    #[schema(value_type = String, format = DateTime)]
    pub expires_at: Option<Timestamp>,
    /// The flag it goes back to then: the manifest's.
    pub goes_back_to: Flag,
}

/// Answer of `POST /plan`: manifests first, in their order, then the services no
/// manifest names.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Plan {
    pub services: Vec<PlanEntry>,
}

/// The part of a service a manifest declares, as one JSON document to diff.
fn declared(description: &str, cfg: &ServiceConfig) -> serde_json::Value {
    json!({"description": description, "policy": cfg.policy, "flags": cfg.flags})
}

fn bad(errors: Vec<FieldError>) -> ApiError {
    ApiError::invalid(ValidationErrors(errors))
}

/// Checks every manifest and that no service appears twice; paths are
/// `manifests[i].<field>`.
fn check(manifests: &[ServiceManifest]) -> ApiResult<()> {
    if manifests.len() > MAX_PLAN_SERVICES {
        return Err(ApiError::bad_field(
            "manifests",
            format!("{} manifests", manifests.len()),
            format!("must be at most {MAX_PLAN_SERVICES} services"),
        ));
    }
    let mut errors = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, m) in manifests.iter().enumerate() {
        if let Err(v) = m.validate() {
            errors.extend(
                v.0.into_iter().map(|e| FieldError { path: format!("manifests[{i}].{}", e.path), ..e }),
            );
        }
        // The write refuses an expiry in the past; so does the plan, or a dry run in CI
        // passes and the apply on merge fails.
        if let Err(crate::actions::ChangeError::InvalidField(e)) =
            crate::actions::flags::all_expire_in_future(&m.flags)
        {
            // A manifest kept in git outlives an absolute expiry: say what to do with it.
            let message = format!(
                "{}: that time has passed (the server removed the flag then); take expires_at, or \
                 the flag, out of the manifest",
                e.message
            );
            errors.push(FieldError { path: format!("manifests[{i}].{}", e.path), message, ..e });
        }
        if !seen.insert(m.key()) {
            errors.push(FieldError {
                path: format!("manifests[{i}].service"),
                value: m.key(),
                message: "the same environment/service appears twice".into(),
            });
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(bad(errors)) }
}

/// What applying `manifests` would do (any role: it writes nothing). 422 for a manifest
/// that does not validate or names an environment that does not exist.
#[utoipa::path(post, path = "/api/v1/plan", tag = "services", request_body = PlanRequest,
    responses((status = 200, body = Plan), (status = 400, body = super::Problem),
              (status = 422, body = super::Problem)))]
pub async fn plan(
    State(s): State<AppState>,
    _a: Auth,
    ApiJson(req): ApiJson<PlanRequest>,
) -> ApiResult<Json<Plan>> {
    check(&req.manifests)?;
    let mut by_env: BTreeMap<&str, Vec<(usize, &ServiceManifest)>> = BTreeMap::new();
    for (i, m) in req.manifests.iter().enumerate() {
        by_env.entry(m.environment.as_str()).or_default().push((i, m));
    }
    let mut missing = Vec::new();
    for (env, ms) in &by_env {
        if s.store.environment(env).await?.is_none() {
            missing.extend(ms.iter().map(|(i, _)| FieldError {
                path: format!("manifests[{i}].environment"),
                value: format!("{env:?}"),
                message: format!(
                    "no environment {env:?}: an admin creates it first (POST /api/v1/environments)"
                ),
            }));
        }
    }
    if !missing.is_empty() {
        return Err(bad(missing));
    }
    let now = Timestamp::now();
    let mut slots: Vec<Option<PlanEntry>> = vec![None; req.manifests.len()];
    let mut others = Vec::new();
    for (env, ms) in by_env {
        let rows = s.store.services(env).await?;
        let named: BTreeSet<&str> = ms.iter().map(|(_, m)| m.service.as_str()).collect();
        let active = s.store.active_profile(env).await?;
        // The flags as stored and as the plan would leave them (`None`: the service would
        // be deleted, which undoes every entry).
        let none = BTreeMap::new();
        let profile =
            |service: &str, stored: &BTreeMap<String, Flag>, planned: Option<&BTreeMap<String, Flag>>| {
                profile_undo(active.as_ref()?, service, stored, planned)
            };
        // The environment as the plan would leave it: what is stored, with every manifest
        // of it in place and, under prune, without the services no manifest names.
        let mut environment: BTreeMap<String, Policy> = advice::environment(&s.store, env).await?;
        environment.retain(|name, _| !req.prune || named.contains(name.as_str()));
        for (_, m) in &ms {
            environment.insert(m.service.clone(), m.policy.clone());
        }
        for (i, m) in ms {
            let row = rows.iter().find(|r| r.name == m.service);
            let config = m.to_config();
            let mut temporary = Vec::new();
            let (action, revision, changes, stored) = match row {
                None => (PlanAction::Create, None, Vec::new(), config.flags.clone()),
                Some(r) => {
                    let snap = s.store.revision(env, &r.name, r.revision).await?.ok_or_else(|| {
                        ApiError::Internal(anyhow::anyhow!(
                            "no snapshot of revision {} of {env}/{}",
                            r.revision,
                            r.name
                        ))
                    })?;
                    let cfg = snap.config()?;
                    // What the write would store: a flag under a temporary value keeps it
                    // (`over_temporary`, the rule the write applies).
                    let mut restores = BTreeMap::new();
                    for (key, _, back) in s.store.temporary_flags(env, &r.name).await? {
                        let back: Flag =
                            serde_json::from_str(&back).map_err(|e| ApiError::Internal(e.into()))?;
                        restores.insert(key, back);
                    }
                    let keys = profile_flag_keys(active.as_ref(), &r.name);
                    let (written, back_to) =
                        over_temporary(&cfg.flags, &restores, &keys, config.flags.clone());
                    for (key, back) in &restores {
                        let Some(now) = written.get(key).filter(|f| cfg.flags.get(key) == Some(*f)) else {
                            continue;
                        };
                        if keys.contains(key) || config.flags.get(key) == Some(now) {
                            continue;
                        }
                        temporary.push(TemporaryFlag {
                            key: key.clone(),
                            value: now.value.clone(),
                            expires_at: now.expires_at,
                            goes_back_to: back_to.get(key).unwrap_or(back).clone(),
                        });
                    }
                    let writes = ServiceConfig { flags: written, ..config.clone() };
                    let changes =
                        json_diff(&declared(&r.description, &cfg), &declared(&m.description, &writes));
                    let action = if changes.is_empty() && back_to.is_empty() {
                        PlanAction::Unchanged
                    } else {
                        PlanAction::Change
                    };
                    (action, Some(r.revision), changes, cfg.flags)
                }
            };
            let agents = s.store.agents(env, &m.service).await?;
            let lints = advice::advise(&m.service, &m.policy, &environment, &agents, now);
            slots[i] = Some(PlanEntry {
                environment: env.to_string(),
                service: m.service.clone(),
                action,
                revision,
                profile: profile(&m.service, &stored, Some(&config.flags)),
                changes,
                lints,
                temporary,
            });
        }
        for r in rows.iter().filter(|r| !named.contains(r.name.as_str())) {
            others.push(PlanEntry {
                environment: env.to_string(),
                service: r.name.clone(),
                action: if req.prune { PlanAction::Prune } else { PlanAction::Unmanaged },
                revision: Some(r.revision),
                changes: Vec::new(),
                lints: Vec::new(),
                profile: profile(&r.name, &none, if req.prune { None } else { Some(&none) }),
                temporary: Vec::new(),
            });
        }
    }
    let mut services: Vec<PlanEntry> = slots.into_iter().flatten().collect();
    services.extend(others);
    Ok(Json(Plan { services }))
}
