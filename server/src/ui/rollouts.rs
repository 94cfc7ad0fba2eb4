//! The rollout page: a staged rollout's stages, its cohort beside the rest, every instance,
//! and the operator's steps (promote, pause, resume, abort), each behind a confirmation
//! page with a reason, like every other change of the UI.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::error::UiError;
use super::page::{Layout, Page, When, duration, seg, service_url, time};
use super::session::{Posted, UiUser, reason};
use crate::actions::{Action, InstanceView, RolloutDetail};
use crate::web::{AppState, RequestId};

struct StageView {
    share: String,
    current: bool,
    done: bool,
}

#[derive(Template)]
#[template(path = "rollout.html")]
struct RolloutPage {
    layout: Layout,
    env: String,
    svc: String,
    base: String,
    url: String,
    id: i64,
    state: String,
    active: bool,
    paused: bool,
    can_operate: bool,
    stages: Vec<StageView>,
    stage: usize,
    bake: String,
    next_stage_at: When,
    started: When,
    created_by: String,
    reason: String,
    outcome: Option<String>,
    ended: When,
    stable_revision: u64,
    candidate_revision: u64,
    revert_revision: Option<u64>,
    cohort: (usize, usize, usize),
    rest: (usize, usize, usize),
    instances: Vec<InstanceView>,
    max_error_rate_increase: String,
    max_nacks: u64,
}

fn url(env: &str, id: i64) -> String {
    format!("/ui/environments/{}/rollouts/{id}", seg(env))
}

/// `GET /ui/environments/{env}/rollouts/{id}`: the rollout as it is now.
pub async fn page(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, id)): Path<(String, i64)>,
) -> Result<Response, UiError> {
    let r = s.actions.rollout(&env, id).await?;
    let RolloutDetail { rollout: r, cohort, rest, instances } = s.actions.rollout_detail(r).await?;
    let stages = r
        .plan
        .stages
        .iter()
        .enumerate()
        .map(|(i, st)| StageView {
            share: match st.instances {
                0 => format!("{} %", st.percent),
                n => format!("{} % and at least {n} instance{}", st.percent, if n == 1 { "" } else { "s" }),
            },
            current: i == r.stage && r.active(),
            done: i < r.stage || r.state == "completed",
        })
        .collect();
    let bake_ms = r.plan.bake.as_millis() as i64;
    let page = RolloutPage {
        layout: user.layout(),
        base: service_url(&r.environment, &r.service),
        url: url(&env, id),
        id,
        active: r.active(),
        paused: r.state == "paused",
        can_operate: user.principal.role >= Action::RolloutPromote.role(),
        stages,
        stage: r.stage + 1,
        bake: duration(r.plan.bake),
        next_stage_at: time(r.stage_started_at.saturating_add(bake_ms)),
        started: time(r.created_at),
        created_by: r.created_by.clone(),
        reason: r.reason.clone(),
        outcome: r.outcome.clone(),
        ended: time(r.ended_at.unwrap_or(0)),
        stable_revision: r.stable_revision,
        candidate_revision: r.candidate_revision,
        revert_revision: r.revert_revision,
        cohort: (cohort.instances, cohort.on_revision, cohort.nacks),
        rest: (rest.instances, rest.on_revision, rest.nacks),
        instances,
        max_error_rate_increase: format!("{:.1}", r.plan.max_error_rate_increase * 100.0),
        max_nacks: r.plan.max_nacks,
        state: r.state,
        env,
        svc: r.service,
    };
    Ok(Page::ok(page).into_response())
}

/// Form of a step and of its confirmation.
#[derive(Debug, Deserialize)]
pub struct StepForm {
    /// `promote`, `pause`, `resume` or `abort`.
    step: String,
    #[serde(default)]
    reason: String,
}

#[derive(Template)]
#[template(path = "rollout_confirm.html")]
struct ConfirmPage {
    layout: Layout,
    env: String,
    svc: String,
    url: String,
    id: i64,
    csrf: String,
    step: String,
    title: String,
    effect: String,
    button: String,
    reason: String,
    error: Option<String>,
}

fn words(step: &str) -> Result<(Action, &'static str, &'static str), UiError> {
    Ok(match step {
        "promote" => (
            Action::RolloutPromote,
            "Promote",
            "The next stage starts now, without waiting for the bake time: more instances get the \
             candidate revision. At the last stage, the rollout completes and every instance gets it.",
        ),
        "pause" => (
            Action::RolloutPause,
            "Pause",
            "No next stage starts until the rollout is resumed. The cohort keeps the candidate, and the \
             server still halts it if the cohort does worse than the rest.",
        ),
        "resume" => {
            (Action::RolloutResume, "Resume", "The current stage bakes again from now, then the next starts.")
        }
        "abort" => (
            Action::RolloutAbort,
            "Abort",
            "A new revision puts the policy the rollout started from back for every instance, at once; the \
             rollout ends as aborted.",
        ),
        other => {
            return Err(UiError::BadRequest(format!("no step {other:?}: promote, pause, resume or abort")));
        }
    })
}

async fn confirm_page(
    s: &AppState,
    user: &UiUser,
    env: &str,
    id: i64,
    f: &StepForm,
    error: Option<String>,
) -> Result<ConfirmPage, UiError> {
    let r = s.actions.rollout(env, id).await?;
    let (_, verb, effect) = words(&f.step)?;
    Ok(ConfirmPage {
        layout: user.layout(),
        env: env.to_string(),
        svc: r.service.clone(),
        url: url(env, id),
        id,
        csrf: user.csrf.clone(),
        step: f.step.clone(),
        title: format!("{verb} rollout {id} of {}", r.service),
        effect: effect.to_string(),
        button: format!("{verb} rollout {id}"),
        reason: f.reason.clone(),
        error,
    })
}

/// `GET …/rollouts/{id}/confirm?step=…`: what the step does; asks for a reason. Changes
/// nothing.
pub async fn confirm(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, id)): Path<(String, i64)>,
    Query(form): Query<StepForm>,
) -> Result<Response, UiError> {
    user.require(words(&form.step)?.0)?;
    Ok(Page::ok(confirm_page(&s, &user, &env, id, &form, None).await?).into_response())
}

/// `POST …/rollouts/{id}`: takes the confirmed step, then shows the rollout.
pub async fn step(
    State(s): State<AppState>,
    rid: RequestId,
    Path((env, id)): Path<(String, i64)>,
    Posted { user, form }: Posted<StepForm>,
) -> Result<Response, UiError> {
    let (action, _, _) = words(&form.step)?;
    let by = user.actor(action, &rid)?;
    let reason = match reason(&form.reason) {
        Ok(r) => r,
        Err(msg) => {
            let page = confirm_page(&s, &user, &env, id, &form, Some(msg)).await?;
            return Ok(Page::with_status(StatusCode::BAD_REQUEST, page).into_response());
        }
    };
    match form.step.as_str() {
        "promote" => drop(s.actions.promote_rollout(&by, &reason, &env, id).await?),
        "pause" => drop(s.actions.pause_rollout(&by, &reason, &env, id).await?),
        "resume" => drop(s.actions.resume_rollout(&by, &reason, &env, id).await?),
        _ => drop(s.actions.abort_rollout(&by, &reason, &env, id).await?),
    }
    Ok(Redirect::to(&url(&env, id)).into_response())
}
