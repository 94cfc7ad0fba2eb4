//! The rollout page: a staged rollout's stages, its cohort beside the rest, every instance,
//! and the operator's steps (promote, pause, resume, abort), each behind a confirmation
//! page with a reason, like every other change of the UI.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use levee_agent::policy::Timestamp;
use serde::Deserialize;

use super::error::UiError;
use super::page::{Layout, Page, When, duration, seg, service_url, time};
use super::session::{Posted, UiUser, reason};
use crate::actions::{Action, InstanceView, RolloutDetail};
use crate::db::{Plan, RolloutState};
use crate::rollout::{self, Side, Verdict};
use crate::web::{AppState, RequestId};

struct StageView {
    share: String,
    current: bool,
    done: bool,
}

/// One line of the health table: a dependency or route, readiness, or NACKs, with what
/// each side did and what the halt rule (`rollout::judge`) concluded.
struct HealthLine {
    subject: String,
    cohort: String,
    rest: String,
    verdict: String,
    worse: bool,
}

fn not_ready(side: &Side) -> String {
    format!(
        "{} of {} reports not ready ({:.1} %)",
        side.not_ready_slots,
        side.instance_slots,
        rollout::percent(side.not_ready_slots, side.instance_slots)
    )
}

/// The health table of a rollout: every subject either side called, readiness and NACKs,
/// each with the rule's conclusion.
fn health_lines(
    v: &Verdict,
    plan: &Plan,
    (cohort, rest): (&Side, &Side),
    nacks: (usize, usize),
) -> Vec<HealthLine> {
    let not_compared = "not compared: no connected instance runs outside the cohort (only NACKs halt)";
    let mut out: Vec<HealthLine> = v
        .subjects
        .iter()
        .map(|s| HealthLine {
            subject: format!("{} {}", s.kind.as_str(), s.name),
            cohort: rollout::calls_in_words(&s.cohort),
            rest: rollout::calls_in_words(&s.rest),
            verdict: if !v.health_compared {
                not_compared.to_string()
            } else if s.worse {
                "worse than the plan tolerates".to_string()
            } else if s.judged {
                "within the plan".to_string()
            } else {
                format!(
                    "not judged yet: {} of the {} cohort calls the plan asks for",
                    s.cohort.calls, plan.min_calls
                )
            },
            worse: s.worse,
        })
        .collect();
    out.push(HealthLine {
        subject: "readiness".to_string(),
        cohort: not_ready(cohort),
        rest: not_ready(rest),
        verdict: if !v.health_compared {
            not_compared.to_string()
        } else if v.readiness_worse {
            "worse than the plan tolerates".to_string()
        } else if v.readiness_judged {
            "within the plan".to_string()
        } else {
            format!(
                "not judged yet: {} of the {} cohort reports it needs",
                cohort.instance_slots,
                rollout::MIN_READINESS_SLOTS
            )
        },
        worse: v.readiness_worse,
    });
    out.push(HealthLine {
        subject: "NACKs of the candidate".to_string(),
        cohort: nacks.0.to_string(),
        rest: nacks.1.to_string(),
        verdict: if v.nacks_worse {
            format!("more than the {} the plan tolerates", plan.max_nacks)
        } else {
            format!("within the {} the plan tolerates", plan.max_nacks)
        },
        worse: v.nacks_worse,
    });
    out
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
    min_calls: u64,
    /// What each side did and the halt rule's conclusion, line by line.
    health: Vec<HealthLine>,
    /// Since when the health is summed (the rollout's start, at most 15 minutes back).
    health_since: When,
    /// The rule's reason to halt, while the rollout runs and the rule says so (the
    /// server's next turn halts it).
    halting: Option<String>,
}

pub(super) fn url(env: &str, id: i64) -> String {
    format!("/ui/environments/{}/rollouts/{id}", seg(env))
}

/// The page of the rollout in progress that serves `w`'s revision to its cohort (a change
/// the environment staged), if there is one: where a commit from the UI goes next.
pub(super) fn started_by(env: &str, w: &crate::actions::Written) -> Option<String> {
    let r = w.rollout.as_ref()?;
    (w.changed && r.active() && r.candidate_revision == w.snapshot.revision).then(|| url(env, r.id))
}

/// `GET /ui/environments/{env}/rollouts/{id}`: the rollout as it is now.
pub async fn page(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, id)): Path<(String, i64)>,
) -> Result<Response, UiError> {
    let r = s.actions.rollout(&env, id).await?;
    let now = Timestamp::now().unix_ms();
    let sides = rollout::sides(&s.health, &s.store, &r, now).await?;
    let verdict = s.actions.rollout_verdict(&r, sides.clone()).await?;
    let RolloutDetail { rollout: r, cohort, rest, instances, verdict } =
        s.actions.rollout_detail(r, verdict).await?;
    let health = health_lines(&verdict, &r.plan, (&sides.0, &sides.1), (cohort.nacks, rest.nacks));
    let health_since = time(r.created_at.max(now - rollout::HEALTH_LOOKBACK.as_millis() as i64));
    let halting = verdict.reason.filter(|_| r.active());
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
            done: i < r.stage || r.state == RolloutState::Completed,
        })
        .collect();
    let bake_ms = r.plan.bake.as_millis() as i64;
    let page = RolloutPage {
        layout: user.layout(),
        base: service_url(&r.environment, &r.service),
        url: url(&env, id),
        id,
        active: r.active(),
        paused: r.state == RolloutState::Paused,
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
        min_calls: r.plan.min_calls,
        health,
        health_since,
        halting,
        state: r.state.to_string(),
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
