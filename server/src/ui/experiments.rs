//! Experiments in the console: the list of an environment's (or a service's), a form
//! defining one (every bad field shown at its field), a confirmation before it starts (or is
//! proposed for approval where a rule covers experiments), its page while it runs (state,
//! the hypothesis' readings before, during and after, reloading itself) and once it ended
//! (verdict and why, a chart per probe over the timeline, who started and stopped it), and
//! a stop behind a confirmation. Every change is the experiment action the API takes.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use levee_agent::policy::{FallbackLevel, FaultAction, FieldError, ValidationErrors, duration as dur};
use serde::Deserialize;
use serde_json::Value;

use super::error::UiError;
use super::page::{Layout, Page, When, duration, seg, service_url, time};
use super::session::{Posted, UiUser, reason};
use crate::actions::{Action, ChangeError, Started};
use crate::db::{ChangeKind, ExperimentRow};
use crate::experiments::Reading;
use crate::experiments::report::{self, Report};
use crate::experiments::spec::{BlastRadius, ExperimentSpec, FaultSpec, Probe};
use crate::web::{AppState, RequestId, of_environment};

fn list_url(env: &str) -> String {
    format!("/ui/environments/{}/experiments", seg(env))
}

fn page_url(env: &str, id: i64) -> String {
    format!("/ui/environments/{}/experiments/{id}", seg(env))
}

// ---- the list --------------------------------------------------------------------------

struct Line {
    id: i64,
    url: String,
    name: String,
    service: String,
    state: String,
    verdict: String,
    created_by: String,
    created: When,
}

#[derive(Template)]
#[template(path = "experiments.html")]
struct ListPage {
    layout: Layout,
    env: String,
    service: Option<String>,
    can_start: bool,
    allow_faults: bool,
    gated: bool,
    lines: Vec<Line>,
    new_url: String,
}

/// Query of the list and of the form: one service only.
#[derive(Debug, Default, Deserialize)]
pub struct ServiceQuery {
    #[serde(default)]
    service: Option<String>,
}

/// `GET /ui/environments/{env}/experiments[?service=]`.
pub async fn list(
    State(s): State<AppState>,
    user: UiUser,
    Path(env): Path<String>,
    Query(q): Query<ServiceQuery>,
) -> Result<Response, UiError> {
    let e = s
        .store
        .environment(&env)
        .await?
        .ok_or_else(|| UiError::NotFound(format!("no environment {env:?}")))?;
    let service = q.service.filter(|v| !v.is_empty());
    let lines = s
        .store
        .experiments(Some(&env), service.as_deref())
        .await?
        .into_iter()
        .map(|mut x| {
            if !crate::actions::sees_injected(&x, &user.principal) {
                crate::actions::hide_injected(&mut x);
            }
            x
        })
        .map(|x| Line {
            url: page_url(&env, x.id),
            id: x.id,
            name: x.name,
            service: x.service,
            state: x.state.to_string(),
            verdict: x.verdict.unwrap_or_default(),
            created_by: x.created_by,
            created: time(x.created_at),
        })
        .collect();
    let new_url = match &service {
        Some(svc) => format!("{}/new?service={}", list_url(&env), seg(svc)),
        None => format!("{}/new", list_url(&env)),
    };
    let page = ListPage {
        layout: user.layout(),
        can_start: user.principal.role >= Action::ExperimentStart.role(),
        allow_faults: e.allow_faults,
        gated: s.store.approval_kinds(&env).await?.contains(&ChangeKind::Experiment),
        env,
        service,
        lines,
        new_url,
    };
    Ok(Page::ok(page).into_response())
}

// ---- defining one ----------------------------------------------------------------------

/// The form defining an experiment: the fields of its spec, the hypothesis as YAML (or
/// JSON) probes, as a file for `levee experiment run` writes them.
#[derive(Clone, Debug, Deserialize)]
pub struct DefineForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    service: String,
    #[serde(default)]
    dependency: String,
    #[serde(default)]
    operation: String,
    /// `delay`, `abort` or `connection_error`.
    #[serde(default = "abort")]
    action: String,
    /// The delay (`2s`) or the HTTP status (`503`).
    #[serde(default)]
    param: String,
    #[serde(default = "hundred")]
    percent: String,
    /// `instances`, `percent` or `all`.
    #[serde(default = "instances")]
    radius_kind: String,
    #[serde(default = "one")]
    radius: String,
    #[serde(default = "sixty")]
    duration: String,
    #[serde(default = "ten")]
    baseline: String,
    #[serde(default = "ten")]
    recovery: String,
    #[serde(default = "five")]
    abort_after: String,
    #[serde(default)]
    hypothesis: String,
    /// `on` for a game day (the checkbox's value); left out (empty) for an experiment.
    #[serde(default)]
    game_day: String,
}

fn abort() -> String {
    "abort".into()
}
fn hundred() -> String {
    "100".into()
}
fn instances() -> String {
    "instances".into()
}
fn one() -> String {
    "1".into()
}
fn sixty() -> String {
    "60s".into()
}
fn ten() -> String {
    "10s".into()
}
fn five() -> String {
    "5s".into()
}

impl Default for DefineForm {
    fn default() -> Self {
        serde_json::from_value(serde_json::json!({}))
            .unwrap_or_else(|_| unreachable!("every field has a default"))
    }
}

fn field(path: &str, value: &str, message: impl Into<String>) -> FieldError {
    FieldError { path: path.into(), value: value.into(), message: message.into() }
}

impl DefineForm {
    /// The spec the form says, or every field it could not read.
    fn spec(&self, env: &str) -> Result<ExperimentSpec, Vec<FieldError>> {
        let mut errors = Vec::new();
        let mut time = |path: &str, text: &str| match dur::parse(text.trim()) {
            Ok(d) => d,
            Err(m) => {
                errors.push(field(path, text, m));
                std::time::Duration::ZERO
            }
        };
        let duration = time("duration", &self.duration);
        let baseline = time("baseline", &self.baseline);
        let recovery = time("recovery", &self.recovery);
        let abort_after = time("abort_after", &self.abort_after);
        let param = self.param.trim();
        let action = match self.action.as_str() {
            "delay" => match dur::parse(param) {
                Ok(delay) => Some(FaultAction::Delay { delay }),
                Err(m) => {
                    errors.push(field("fault.action", param, format!("the delay: {m}")));
                    None
                }
            },
            "abort" => match param.parse() {
                Ok(status) => Some(FaultAction::Abort { status }),
                Err(_) => {
                    errors.push(field("fault.action", param, "the status: an HTTP status such as 503"));
                    None
                }
            },
            "connection_error" => Some(FaultAction::ConnectionError),
            other => {
                errors.push(field("fault.action", other, "must be delay, abort or connection_error"));
                None
            }
        };
        let percent = self.percent.trim().parse::<f64>().unwrap_or_else(|_| {
            errors.push(field("fault.percent", &self.percent, "must be a number of percent, 0 to 100"));
            0.0
        });
        let r = self.radius.trim();
        let blast_radius = match self.radius_kind.as_str() {
            "instances" => BlastRadius::Instances(r.parse().unwrap_or_else(|_| {
                errors.push(field("blast_radius.instances", r, "must be a whole number of instances"));
                0
            })),
            "percent" => BlastRadius::Percent(r.parse().unwrap_or_else(|_| {
                errors.push(field("blast_radius.percent", r, "must be a number of percent"));
                0.0
            })),
            "all" => BlastRadius::All(true),
            other => {
                errors.push(field("blast_radius", other, "must be instances, percent or all"));
                BlastRadius::default()
            }
        };
        let hypothesis: Vec<Probe> = if self.hypothesis.trim().is_empty() {
            Vec::new() // refused by the spec's own check, naming the field
        } else {
            serde_saphyr::from_str(&self.hypothesis).unwrap_or_else(|e| {
                errors.push(field("hypothesis", "", format!("not a list of probes: {e}")));
                Vec::new()
            })
        };
        let game_day = match self.game_day.as_str() {
            "" => false,
            "on" => true,
            other => {
                errors.push(field("game_day", other, "must be on (a game day) or left out"));
                false
            }
        };
        let op = self.operation.trim();
        let spec = ExperimentSpec {
            name: self.name.trim().to_string(),
            description: self.description.trim().to_string(),
            environment: env.to_string(),
            service: self.service.trim().to_string(),
            fault: FaultSpec {
                dependency: self.dependency.trim().to_string(),
                operation: (!op.is_empty()).then(|| op.to_string()),
                action: action.unwrap_or(FaultAction::ConnectionError),
                percent,
            },
            blast_radius,
            duration,
            baseline,
            recovery,
            abort_after,
            hypothesis,
            game_day,
        };
        if !errors.is_empty() {
            // What could be read is checked too, so every bad field shows at once.
            let read: Vec<&'static str> = errors.iter().map(|e| form_field(&e.path)).collect();
            errors.extend(spec.check().into_iter().filter(|c| !read.contains(&form_field(&c.path))));
            return Err(errors);
        }
        match spec.check() {
            e if e.is_empty() => Ok(spec),
            e => Err(e),
        }
    }

    /// The form showing `spec` (to correct it after a refusal).
    fn from_spec(spec: &ExperimentSpec) -> DefineForm {
        let (action, param) = match &spec.fault.action {
            FaultAction::Delay { delay } => ("delay", duration(*delay)),
            FaultAction::Abort { status } => ("abort", status.to_string()),
            FaultAction::ConnectionError => ("connection_error", String::new()),
        };
        let (radius_kind, radius) = match spec.blast_radius {
            BlastRadius::Instances(n) => ("instances", n.to_string()),
            BlastRadius::Percent(p) => ("percent", p.to_string()),
            BlastRadius::All(_) => ("all", String::new()),
        };
        DefineForm {
            name: spec.name.clone(),
            description: spec.description.clone(),
            service: spec.service.clone(),
            dependency: spec.fault.dependency.clone(),
            operation: spec.fault.operation.clone().unwrap_or_default(),
            action: action.into(),
            param,
            percent: spec.fault.percent.to_string(),
            radius_kind: radius_kind.into(),
            radius,
            duration: duration(spec.duration),
            baseline: duration(spec.baseline),
            recovery: duration(spec.recovery),
            abort_after: duration(spec.abort_after),
            hypothesis: serde_json::to_string_pretty(&spec.hypothesis).unwrap_or_default(),
            game_day: if spec.game_day { "on".into() } else { String::new() },
        }
    }
}

/// The form field a spec path is shown at.
fn form_field(path: &str) -> &'static str {
    let head =
        |p: &str| path == p || path.starts_with(&format!("{p}.")) || path.starts_with(&format!("{p}["));
    match () {
        _ if head("fault.dependency") => "dependency",
        _ if head("fault.operation") => "operation",
        _ if head("fault.percent") => "percent",
        _ if head("fault.action") || head("fault") => "action",
        _ if head("blast_radius") => "radius",
        _ if head("service") || head("environment") => "service",
        _ if head("name") => "name",
        _ if head("description") => "description",
        _ if head("duration") => "duration",
        _ if head("baseline") => "baseline",
        _ if head("recovery") => "recovery",
        _ if head("abort_after") => "abort_after",
        _ if head("hypothesis") => "hypothesis",
        _ if head("game_day") => "game_day",
        _ => "",
    }
}

/// One refusal as a form shows it: at its field (`""`: above the form).
struct Shown {
    field: &'static str,
    text: String,
}

#[derive(Template)]
#[template(path = "experiment_new.html")]
struct DefinePage {
    layout: Layout,
    env: String,
    csrf: String,
    services: Vec<String>,
    form: DefineForm,
    errors: Vec<Shown>,
}

impl DefinePage {
    /// The refusals shown at `field`, in words.
    fn errors_at(&self, field: &str) -> Vec<&str> {
        self.errors.iter().filter(|e| e.field == field).map(|e| e.text.as_str()).collect()
    }
}

async fn define_page(
    s: &AppState,
    user: &UiUser,
    env: &str,
    form: DefineForm,
    errors: Vec<FieldError>,
) -> Result<Response, UiError> {
    let services = s.store.services(env).await?.into_iter().map(|x| x.name).collect();
    let status = if errors.is_empty() { StatusCode::OK } else { StatusCode::BAD_REQUEST };
    let errors =
        errors.into_iter().map(|e| Shown { field: form_field(&e.path), text: e.to_string() }).collect();
    let page = DefinePage {
        layout: user.layout(),
        env: env.to_string(),
        csrf: user.csrf.clone(),
        services,
        form,
        errors,
    };
    Ok(Page::with_status(status, page).into_response())
}

/// `GET /ui/environments/{env}/experiments/new[?service=]`: the form (operator).
pub async fn new(
    State(s): State<AppState>,
    user: UiUser,
    Path(env): Path<String>,
    Query(q): Query<ServiceQuery>,
) -> Result<Response, UiError> {
    user.require(Action::ExperimentStart)?;
    s.store.environment(&env).await?.ok_or_else(|| UiError::NotFound(format!("no environment {env:?}")))?;
    let form = DefineForm {
        service: q.service.unwrap_or_default(),
        hypothesis: "- ready: true\n".into(),
        ..DefineForm::default()
    };
    define_page(&s, &user, &env, form, Vec::new()).await
}

// ---- confirming and starting -----------------------------------------------------------

#[derive(Template)]
#[template(path = "experiment_confirm.html")]
struct ConfirmPage {
    layout: Layout,
    env: String,
    csrf: String,
    title: String,
    /// What happens, line by line.
    effects: Vec<String>,
    action_url: String,
    back_url: String,
    /// The spec, as JSON, for a start.
    spec: String,
    button: String,
    reason: String,
    error: Option<String>,
}

fn start_effects(spec: &ExperimentSpec, gated: bool) -> Vec<String> {
    let fault = match &spec.fault.action {
        FaultAction::Delay { delay } => format!("adds {} to", duration(*delay)),
        FaultAction::Abort { status } => format!("fails with status {status}"),
        FaultAction::ConnectionError => "fails as a connection error".into(),
    };
    let on = match spec.blast_radius {
        BlastRadius::Instances(n) => format!("{n} instance(s)"),
        BlastRadius::Percent(p) => format!("{p} % of the instances"),
        BlastRadius::All(_) => "every instance".into(),
    };
    let mut out = Vec::new();
    if spec.game_day {
        out.push(
            "A game day: people in the loop. While it runs, what it injects, where and what it measures are \
             hidden from everyone but you and admins; they see that a game day runs, by whom. It measures when \
             someone first opened the service's page, when the first lever was pulled and by whom, and when \
             the hypothesis held again."
                .to_string(),
        );
    }
    if gated {
        out.push(
            "The approval rules of this environment cover experiments: nothing starts now. This proposes the \
             experiment as a change request; it starts once another person approves it and it is applied."
                .to_string(),
        );
    }
    out.push(format!(
        "First the hypothesis is measured for {} (the baseline); nothing is injected unless every probe held, with data:",
        duration(spec.baseline)
    ));
    out.extend(spec.hypothesis.iter().map(|p| format!("• {}", p.describe())));
    out.push(format!(
        "Then the fault {fault} {} % of the calls of {} to {}{} on {on} of {}, chosen by the server among those connected, for {}.",
        spec.fault.percent,
        spec.service,
        spec.fault.dependency,
        spec.fault.operation.as_deref().map(|o| format!(" ({o})")).unwrap_or_default(),
        spec.service,
        duration(spec.duration),
    ));
    out.push(format!(
        "It aborts by itself once the hypothesis is violated for {}; the fault also ends by itself on every agent \
         at the end, server or not. Then the hypothesis is measured for {} more, and the experiment ends passed, \
         failed or aborted, with why.",
        duration(spec.abort_after),
        duration(spec.recovery)
    ));
    out
}

/// `POST /ui/environments/{env}/experiments/confirm`: checks the form; every bad field is
/// shown at its field; a good one is shown as what it will do, with a reason to give.
/// Changes nothing.
pub async fn confirm(
    State(s): State<AppState>,
    Path(env): Path<String>,
    Posted { user, form }: Posted<DefineForm>,
) -> Result<Response, UiError> {
    user.require(Action::ExperimentStart)?;
    let spec = match form.spec(&env) {
        Ok(spec) => spec,
        Err(errors) => return define_page(&s, &user, &env, form, errors).await,
    };
    let gated = s.store.approval_kinds(&env).await?.contains(&ChangeKind::Experiment);
    let page = ConfirmPage {
        layout: user.layout(),
        csrf: user.csrf.clone(),
        title: format!("Start experiment {} on {}", spec.name, spec.service),
        effects: start_effects(&spec, gated),
        action_url: list_url(&env),
        back_url: format!("{}/new?service={}", list_url(&env), seg(&spec.service)),
        spec: serde_json::to_string(&spec).map_err(anyhow::Error::from)?,
        button: if gated { "Propose the experiment".into() } else { "Start the experiment".into() },
        reason: String::new(),
        error: None,
        env,
    };
    Ok(Page::ok(page).into_response())
}

/// Form of a confirmed start.
#[derive(Debug, Deserialize)]
pub struct StartForm {
    spec: String,
    #[serde(default)]
    reason: String,
}

/// `POST /ui/environments/{env}/experiments`: starts the confirmed experiment (or proposes
/// it where a rule covers experiments), then shows it (or the change requests).
pub async fn start(
    State(s): State<AppState>,
    rid: RequestId,
    Path(env): Path<String>,
    Posted { user, form }: Posted<StartForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::ExperimentStart, &rid)?;
    let spec: ExperimentSpec = serde_json::from_str(&form.spec)
        .map_err(|e| UiError::BadRequest(format!("the experiment confirmed is not readable: {e}")))?;
    if spec.environment != env {
        return Err(UiError::BadRequest(format!("the experiment confirmed is not one of {env:?}")));
    }
    let why = match reason(&form.reason) {
        Ok(r) => r,
        Err(m) => {
            let gated = s.store.approval_kinds(&env).await?.contains(&ChangeKind::Experiment);
            let page = ConfirmPage {
                layout: user.layout(),
                csrf: user.csrf.clone(),
                title: format!("Start experiment {} on {}", spec.name, spec.service),
                effects: start_effects(&spec, gated),
                action_url: list_url(&env),
                back_url: format!("{}/new?service={}", list_url(&env), seg(&spec.service)),
                spec: form.spec.clone(),
                button: if gated { "Propose the experiment".into() } else { "Start the experiment".into() },
                reason: form.reason.clone(),
                error: Some(m),
                env,
            };
            return Ok(Page::with_status(StatusCode::BAD_REQUEST, page).into_response());
        }
    };
    match s.experiments.start(&by, &why, spec.clone()).await {
        Ok(Started::Running(id)) => Ok(Redirect::to(&page_url(&env, id)).into_response()),
        Ok(Started::Pending(r)) => {
            let msg = format!(
                "Approval pending: experiment {} is change request {}; it starts once another person approves it and \
                 it is applied",
                spec.name, r.id
            );
            Ok(Redirect::to(&format!("/ui/environments/{}/requests?done={}", seg(&env), seg(&msg)))
                .into_response())
        }
        Err(ChangeError::Invalid(ValidationErrors(errors))) => {
            define_page(&s, &user, &env, DefineForm::from_spec(&spec), errors).await
        }
        Err(
            e @ (ChangeError::NotFound(_)
            | ChangeError::FaultsNotAllowed { .. }
            | ChangeError::InvalidField(_)),
        ) => {
            define_page(&s, &user, &env, DefineForm::from_spec(&spec), vec![field("", "", e.to_string())])
                .await
        }
        Err(e) => Err(e.into()),
    }
}

// ---- one experiment ------------------------------------------------------------------

/// One probe's chart: its readings over the experiment's time, its threshold, the window
/// the fault was injected. Coordinates are computed here; the template only draws them.
struct Chart {
    title: String,
    /// `x,y x,y …` of the readings with a value.
    line: String,
    dots: Vec<Dot>,
    /// y of the threshold line.
    threshold_y: f64,
    threshold_label: String,
    /// x and width of the injected window, if any.
    band: Option<(f64, f64)>,
    top_label: String,
    bottom_label: String,
}

struct Dot {
    x: f64,
    y: f64,
    /// `held`, `violated`, `nodata`.
    class: &'static str,
    title: String,
}

/// Width and height of a chart's plot area, in SVG units, and its margin.
const CHART_W: f64 = 640.0;
const CHART_H: f64 = 120.0;

/// A reading's value of a probe as a number to plot (a level as its rank, best on top) and
/// the threshold the same way; `None` when it has no number.
fn plotted(probe: &Probe, v: &Value) -> Option<f64> {
    match probe {
        Probe::FeatureLevel { .. } => v.as_str().and_then(FallbackLevel::parse).map(|l| -(l.rank() as f64)),
        _ => v.as_f64(),
    }
}

fn threshold(probe: &Probe) -> (f64, String) {
    match probe {
        Probe::SuccessRate { at_least, .. } => (*at_least, format!("≥ {at_least} %")),
        Probe::P99 { at_most, .. } => (at_most.as_secs_f64() * 1000.0, format!("≤ {}", duration(*at_most))),
        Probe::FeatureLevel { at_least, .. } => (
            -(FallbackLevel::parse(at_least).map_or(0, FallbackLevel::rank) as f64),
            format!("{at_least} or better"),
        ),
        Probe::Ready(_) => (0.0, "0 not ready".into()),
    }
}

fn charts(e: &ExperimentRow, r: &Report) -> Vec<Chart> {
    let Some(spec) = &r.spec else { return Vec::new() };
    let (Some(first), Some(last)) = (r.readings.first(), r.readings.last()) else { return Vec::new() };
    let t0 = first.at.min(e.injected_at.unwrap_or(first.at));
    let t1 = last.at.max(e.fault_removed_at.unwrap_or(last.at)).max(t0 + 1);
    let x = |t: i64| ((t - t0) as f64 / (t1 - t0) as f64 * CHART_W * 100.0).round() / 100.0;
    spec.hypothesis
        .iter()
        .enumerate()
        .map(|(i, probe)| {
            let (limit, threshold_label) = threshold(probe);
            let values: Vec<(i64, Option<f64>, Option<bool>, String)> = r
                .readings
                .iter()
                .map(|rd: &Reading| {
                    let v = rd.values.get(i).cloned().flatten();
                    let shown = v.as_ref().map(|v| v.to_string()).unwrap_or_else(|| "no data".into());
                    let title = format!("{}: {shown}", rd.phase.as_str());
                    (
                        rd.at,
                        v.as_ref().and_then(|v| plotted(probe, v)),
                        rd.holds.get(i).copied().flatten(),
                        title,
                    )
                })
                .collect();
            let mut lo = values.iter().filter_map(|v| v.1).fold(limit, f64::min);
            let mut hi = values.iter().filter_map(|v| v.1).fold(limit, f64::max);
            if hi - lo < 1e-9 {
                lo -= 1.0;
                hi += 1.0;
            }
            let pad = (hi - lo) * 0.1;
            let (lo, hi) = (lo - pad, hi + pad);
            let y = |v: f64| ((hi - v) / (hi - lo) * CHART_H * 100.0).round() / 100.0;
            let line = values
                .iter()
                .filter_map(|(at, v, _, _)| v.map(|v| format!("{},{}", x(*at), y(v))))
                .collect::<Vec<_>>()
                .join(" ");
            let dots = values
                .iter()
                .map(|(at, v, holds, title)| Dot {
                    x: x(*at),
                    y: v.map_or(CHART_H, y),
                    class: match holds {
                        Some(true) => "held",
                        Some(false) => "violated",
                        None => "nodata",
                    },
                    title: title.clone(),
                })
                .collect();
            let band = e.injected_at.map(|from| {
                let to = e.fault_removed_at.unwrap_or(t1);
                (x(from), (x(to) - x(from)).max(1.0))
            });
            let label = |v: f64| match probe {
                Probe::FeatureLevel { .. } => FallbackLevel::ALL
                    .get((-v).round().max(0.0) as usize)
                    .map_or("", |l| l.as_str())
                    .to_string(),
                Probe::P99 { .. } => format!("{:.0} ms", v),
                Probe::SuccessRate { .. } => format!("{:.1} %", v),
                Probe::Ready(_) => format!("{:.0} not ready", v.max(0.0)),
            };
            Chart {
                title: probe.describe(),
                line,
                dots,
                threshold_y: y(limit),
                threshold_label,
                band,
                top_label: label(hi),
                bottom_label: label(lo),
            }
        })
        .collect()
}

struct ReadingLine {
    at: When,
    phase: &'static str,
    cells: Vec<(String, &'static str)>,
}

#[derive(Template)]
#[template(path = "experiment.html")]
struct ExperimentPage {
    layout: Layout,
    env: String,
    svc_url: String,
    e: ExperimentRow,
    state: String,
    running: bool,
    can_stop: bool,
    created: When,
    ended: When,
    stop_requested: When,
    instances: String,
    fault: String,
    probes: Vec<String>,
    charts: Vec<Chart>,
    chart_w: f64,
    chart_h: f64,
    readings: Vec<ReadingLine>,
    timeline: Vec<(When, String, String, String)>,
    stop_url: String,
    notice: Option<String>,
    /// A game day: whether what it injected is hidden from the viewer.
    game_day_hidden: bool,
    /// A game day's measures in words (time to detect, mitigate, recover; runbooks).
    game_day: Vec<String>,
}

/// Query of the experiment page.
#[derive(Debug, Default, Deserialize)]
pub struct DoneQuery {
    done: Option<String>,
}

async fn experiment(s: &AppState, env: &str, id: i64) -> Result<ExperimentRow, UiError> {
    Ok(of_environment(s.store.experiment(id).await?, env, id)?)
}

/// Experiment `id` as `user` may see it, and whether they see what it injected: a game day
/// still running shows its players only that it runs, by whom and since when.
async fn experiment_as_seen(
    s: &AppState,
    env: &str,
    id: i64,
    user: &UiUser,
) -> Result<(ExperimentRow, bool), UiError> {
    let mut e = experiment(s, env, id).await?;
    let shown = crate::actions::sees_injected(&e, &user.principal);
    if !shown {
        crate::actions::hide_injected(&mut e);
    }
    Ok((e, shown))
}

/// `GET /ui/environments/{env}/experiments/{id}`: where it is, its readings and its report;
/// it reloads itself every two seconds while it runs.
pub async fn page(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, id)): Path<(String, i64)>,
    Query(q): Query<DoneQuery>,
) -> Result<Response, UiError> {
    let (e, shown) = experiment_as_seen(&s, &env, id, &user).await?;
    let stored = if shown { s.store.experiment_readings(id).await? } else { Vec::new() };
    let mut r = report::report(&e, stored)?;
    let game_day = if shown && crate::actions::is_game_day(&e) {
        let g = crate::experiments::game_day::report(&s.store, &e, r.spec.as_ref(), &r.readings).await?;
        crate::experiments::game_day::moments(&g, &mut r.timeline);
        g.summary
    } else {
        Vec::new()
    };
    let fault = r
        .spec
        .as_ref()
        .map(|spec| {
            let what = match &spec.fault.action {
                FaultAction::Delay { delay } => format!("delay {}", duration(*delay)),
                FaultAction::Abort { status } => format!("abort with {status}"),
                FaultAction::ConnectionError => "connection error".into(),
            };
            format!("{what} on {} % of the calls to {}", spec.fault.percent, spec.fault.dependency)
        })
        .unwrap_or_default();
    let readings = r
        .readings
        .iter()
        .map(|rd| ReadingLine {
            at: time(rd.at),
            phase: rd.phase.as_str(),
            cells: rd
                .values
                .iter()
                .zip(&rd.holds)
                .map(|(v, h)| {
                    let text = v.as_ref().map(|v| v.to_string()).unwrap_or_else(|| "no data".into());
                    (
                        text,
                        match h {
                            Some(true) => "held",
                            Some(false) => "violated",
                            None => "nodata",
                        },
                    )
                })
                .collect(),
        })
        .collect();
    let timeline = r
        .timeline
        .iter()
        .map(|t| (time(t.at), t.event.clone(), t.by.clone().unwrap_or_default(), t.detail.clone()))
        .collect();
    let running = e.state.is_running();
    let page = ExperimentPage {
        layout: user.layout(),
        svc_url: service_url(&env, &e.service),
        state: e.state.to_string(),
        running,
        can_stop: running
            && e.stop_requested_at.is_none()
            && user.principal.role >= Action::ExperimentStop.role(),
        created: time(e.created_at),
        ended: time(e.ended_at.unwrap_or(0)),
        stop_requested: time(e.stop_requested_at.unwrap_or(0)),
        instances: e
            .instances
            .as_deref()
            .and_then(|i| serde_json::from_str::<Vec<String>>(i).ok())
            .map(|i| i.join(", "))
            .unwrap_or_default(),
        fault,
        probes: r.probes.clone(),
        charts: charts(&e, &r),
        chart_w: CHART_W,
        chart_h: CHART_H,
        readings,
        timeline,
        stop_url: format!("{}/stop", page_url(&env, id)),
        notice: q.done,
        game_day_hidden: !shown,
        game_day,
        env,
        e,
    };
    Ok(Page::ok(page).into_response())
}

/// Form of a stop.
#[derive(Debug, Default, Deserialize)]
pub struct StopForm {
    #[serde(default)]
    reason: String,
}

fn stop_page(
    user: &UiUser,
    env: &str,
    e: &ExperimentRow,
    reason: String,
    error: Option<String>,
) -> ConfirmPage {
    ConfirmPage {
        layout: user.layout(),
        env: env.to_string(),
        csrf: user.csrf.clone(),
        title: format!("Stop experiment {} ({})", e.id, e.name),
        effects: vec![
            "The experiment aborts at its next reading (within a second): its fault is removed from every \
             instance, the recovery is measured, and it ends as aborted, saying who stopped it and why."
                .into(),
        ],
        action_url: format!("{}/stop", page_url(env, e.id)),
        back_url: page_url(env, e.id),
        spec: String::new(),
        button: format!("Stop experiment {}", e.id),
        reason,
        error,
    }
}

/// `GET …/experiments/{id}/stop`: what stopping does; asks for a reason. Changes nothing.
pub async fn confirm_stop(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, id)): Path<(String, i64)>,
) -> Result<Response, UiError> {
    user.require(Action::ExperimentStop)?;
    let (e, _) = experiment_as_seen(&s, &env, id, &user).await?;
    Ok(Page::ok(stop_page(&user, &env, &e, String::new(), None)).into_response())
}

/// `POST …/experiments/{id}/stop`: asks the experiment to stop, then shows it.
pub async fn stop(
    State(s): State<AppState>,
    rid: RequestId,
    Path((env, id)): Path<(String, i64)>,
    Posted { user, form }: Posted<StopForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::ExperimentStop, &rid)?;
    let (e, _) = experiment_as_seen(&s, &env, id, &user).await?;
    let why = match reason(&form.reason) {
        Ok(r) => r,
        Err(m) => {
            let page = stop_page(&user, &env, &e, form.reason.clone(), Some(m));
            return Ok(Page::with_status(StatusCode::BAD_REQUEST, page).into_response());
        }
    };
    let msg = match s.actions.stop_experiment(&by, &why, id).await {
        Ok(_) => format!("Experiment {id} asked to stop: it aborts at its next reading"),
        Err(e @ ChangeError::NotFound(_)) => format!("Not stopped: {e} (it ended, or someone asked already)"),
        Err(e) => return Err(e.into()),
    };
    Ok(Redirect::to(&format!("{}?done={}", page_url(&env, id), seg(&msg))).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A form's refusals land at the field that holds them.
    #[test]
    fn spec_paths_are_shown_at_their_fields() {
        assert_eq!(form_field("fault.percent"), "percent");
        assert_eq!(form_field("fault.action.status"), "action");
        assert_eq!(form_field("blast_radius.percent"), "radius");
        assert_eq!(form_field("hypothesis[2].p99.at_most"), "hypothesis");
        assert_eq!(form_field("abort_after"), "abort_after");
        assert_eq!(form_field("name"), "name");
        assert_eq!(form_field("game_day"), "game_day");
        assert_eq!(form_field(""), "");
    }

    /// A bad duration and a bad hypothesis are both shown, each at its field, with what
    /// the spec's own check finds in the rest.
    #[test]
    fn every_bad_field_is_reported_at_once() {
        let f = DefineForm {
            name: String::new(),
            duration: "soon".into(),
            hypothesis: "{not: [a list".into(),
            ..DefineForm::default()
        };
        let errors = f.spec("prod").unwrap_err();
        let fields: Vec<&str> = errors.iter().map(|e| form_field(&e.path)).collect();
        for want in ["duration", "hypothesis", "name"] {
            assert!(fields.contains(&want), "{want} missing: {errors:?}");
        }
    }
}
