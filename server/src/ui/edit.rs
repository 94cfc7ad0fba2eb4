//! Policy editing: forms for one part of the policy at a time (a dependency's timeouts,
//! retry, breaker, bulkhead, fallback and kill switch; a degradation-matrix row; the
//! inbound admission settings; the deadlines) and a raw JSON/YAML editor, without
//! JavaScript.
//!
//! Three steps: `GET …/policy/edit?part=…` shows the form filled with the current values;
//! `POST …/policy/preview` applies what was typed to the current policy and shows the
//! result — the diff against the current revision, every decoding and validation error at
//! its field, the lint warnings — and, when it is valid and changes something, a commit
//! form carrying the exact policy previewed and the revision it was based on;
//! `POST …/policy/commit` takes the policy update action with a reason (a conflict if the
//! service moved meanwhile).
//!
//! A form field is one scalar leaf of the part's JSON, named by its JSON pointer
//! (`v:/dependencies/payments/attempt_timeout`), with its type carried beside it
//! (`k:…`: `s` string, `n` number, `b` bool, `z` absent, `l` list of strings), so every
//! field of the model is editable without a hand-written form per field, and errors,
//! whose paths are dotted (`dependencies.payments.attempt_timeout`), land on their field.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use levee_agent::policy::{Lint, Policy};
use serde::Deserialize;
use serde_json::Value;

use super::approval::{self, Gate, Mode};
use super::error::UiError;
use super::page::{Layout, Page, service_url};
use super::session::{Posted, UiUser, reason};
use crate::actions::{Action, ChangeError, Proposal, ServiceAt};
use crate::db::ChangeKind;
use crate::diff::{DiffEntry, json_diff};
use crate::web::{AppState, RequestId};

/// Largest raw policy accepted by the editor, in bytes.
pub const MAX_RAW_POLICY_BYTES: usize = 256 * 1024;

/// A part of the policy with its own form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// Deadlines and service-wide settings (the scalar fields at the top of the policy).
    Service,
    /// One dependency.
    Dependency(String),
    /// One degradation-matrix row, by index.
    Matrix(usize),
    /// Inbound admission.
    Inbound,
    /// The whole policy as JSON or YAML text.
    Raw,
}

impl Part {
    /// Parses `service`, `raw`, `inbound`, `dependency:<name>`, `matrix:<index>`.
    pub fn parse(s: &str) -> Option<Part> {
        Some(match s {
            "" | "service" => Part::Service,
            "raw" => Part::Raw,
            "inbound" => Part::Inbound,
            _ => match s.split_once(':')? {
                ("dependency", name) => Part::Dependency(name.to_string()),
                ("matrix", i) => Part::Matrix(i.parse().ok()?),
                _ => return None,
            },
        })
    }

    /// The value of the `part` parameter.
    pub fn key(&self) -> String {
        match self {
            Part::Service => "service".into(),
            Part::Raw => "raw".into(),
            Part::Inbound => "inbound".into(),
            Part::Dependency(n) => format!("dependency:{n}"),
            Part::Matrix(i) => format!("matrix:{i}"),
        }
    }

    /// A title for people.
    pub fn title(&self, policy: &Value) -> String {
        match self {
            Part::Service => "Deadlines and service-wide settings".into(),
            Part::Raw => "Whole policy (JSON or YAML)".into(),
            Part::Inbound => "Inbound admission".into(),
            Part::Dependency(n) => format!("Dependency {n}"),
            Part::Matrix(i) => match policy["degradation_matrix"][*i]["feature"].as_str() {
                Some(f) => format!("Degradation matrix: {f}"),
                None => format!("Degradation matrix row {i}"),
            },
        }
    }

    /// JSON pointer of the part inside the policy.
    fn pointer(&self) -> String {
        match self {
            Part::Service | Part::Raw => String::new(),
            Part::Inbound => "/inbound".into(),
            Part::Dependency(n) => format!("/dependencies/{}", escape_token(n)),
            Part::Matrix(i) => format!("/degradation_matrix/{i}"),
        }
    }
}

fn escape_token(t: &str) -> String {
    t.replace('~', "~0").replace('/', "~1")
}

fn unescape_token(t: &str) -> String {
    t.replace("~1", "/").replace("~0", "~")
}

/// The dotted path errors use (`dependencies.payments.retry.max_attempts`,
/// `degradation_matrix[0].alert_after`) of a JSON pointer into a policy.
fn dotted(pointer: &str, policy: &Value) -> String {
    let mut out = String::new();
    let mut at = policy;
    for raw in pointer.split('/').skip(1) {
        let token = unescape_token(raw);
        match at {
            Value::Array(a) => {
                out.push_str(&format!("[{token}]"));
                at = token.parse::<usize>().ok().and_then(|i| a.get(i)).unwrap_or(&Value::Null);
            }
            _ => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&token);
                at = at.get(&token).unwrap_or(&Value::Null);
            }
        }
    }
    out
}

/// One editable leaf.
#[derive(Clone, Debug)]
pub struct Field {
    /// JSON pointer into the policy (the form field's name after `v:`).
    pub pointer: String,
    /// The dotted path of errors.
    pub path: String,
    /// The field's name for people, relative to the part (`Retry › Max attempts`); the
    /// dotted path is shown beside it as a hint.
    pub label: String,
    /// `s`, `n`, `b`, `z` or `l`.
    pub kind: &'static str,
    /// The value as shown in the input.
    pub value: String,
    /// The error at this field, if any.
    pub error: Option<String>,
    /// The values the field takes when it is an enumeration (a choice, not a text box;
    /// from the model's schema, `schema.rs`).
    pub choices: Vec<String>,
    /// What the field means, in the model's words.
    pub help: String,
}

/// Every scalar leaf under `pointer` in `policy`, in document order.
fn fields(policy: &Value, part: &Part) -> Vec<Field> {
    let root = part.pointer();
    let Some(v) = policy.pointer(&root) else { return Vec::new() };
    let mut out = Vec::new();
    let top_only = *part == Part::Service;
    walk(policy, v, &root, "", top_only, &mut out);
    out
}

fn walk(policy: &Value, v: &Value, pointer: &str, label: &str, top_only: bool, out: &mut Vec<Field>) {
    let mut leaf = |kind: &'static str, value: String| {
        let mut info = super::schema::field(pointer);
        if !info.choices.is_empty() && !value.is_empty() && !info.choices.contains(&value) {
            // A value the model no longer lists stays visible (and is refused at preview).
            info.choices.insert(0, value.clone());
        }
        out.push(Field {
            pointer: pointer.to_string(),
            path: dotted(pointer, policy),
            label: label.to_string(),
            kind,
            value,
            error: None,
            choices: info.choices,
            help: info.help,
        })
    };
    match v {
        Value::Object(m) => {
            if top_only && !label.is_empty() {
                return;
            }
            for (k, child) in m {
                let at = format!("{pointer}/{}", escape_token(k));
                // A field of the model reads as words; a name the operator chose stays as is.
                let name = if super::schema::is_field(&at) { super::schema::label(k) } else { k.clone() };
                let l = if label.is_empty() { name } else { format!("{label} › {name}") };
                walk(policy, child, &at, &l, top_only, out);
            }
        }
        Value::Array(a) if a.iter().all(Value::is_string) => {
            if top_only && !label.is_empty() {
                // Top-level lists (compiled_in_flags) are edited like any list.
            }
            leaf("l", a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", "))
        }
        // Lists of objects (the matrix) have their own parts; edit them raw otherwise.
        Value::Array(_) => {}
        Value::String(s) => leaf("s", s.clone()),
        Value::Number(n) => leaf("n", n.to_string()),
        Value::Bool(b) => leaf("b", b.to_string()),
        Value::Null => leaf("z", String::new()),
    }
}

/// What the user typed in one field, turned into JSON; `Err` says why it is not.
fn typed(kind: &str, text: &str) -> Result<Value, String> {
    let t = text.trim();
    match kind {
        "n" => t
            .parse::<i64>()
            .map(Value::from)
            .or_else(|_| {
                t.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
                    .ok_or(())
            })
            .map_err(|_| format!("{text:?} is not a number")),
        "b" => match t {
            "true" => Ok(Value::Bool(true)),
            "false" => Ok(Value::Bool(false)),
            _ => Err(format!("{text:?} is not true or false")),
        },
        "l" => Ok(Value::Array(
            t.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| Value::String(s.into())).collect(),
        )),
        // An absent optional value: empty keeps it absent; else a number, a bool or text.
        "z" if t.is_empty() => Ok(Value::Null),
        "z" => Ok(typed("n", t).or_else(|_| typed("b", t)).unwrap_or_else(|_| Value::String(t.to_string()))),
        // Text fields that are optional (an `enabled_flag`) are removed when emptied.
        _ if t.is_empty() => Ok(Value::Null),
        _ => Ok(Value::String(t.to_string())),
    }
}

/// A policy checked as the action will check it: strict decoding (path-aware), then
/// every validation error. Errors are `(dotted path, message)`.
fn check(candidate: &Value) -> Result<Policy, Vec<(String, String)>> {
    let policy: Policy = serde_path_to_error::deserialize(candidate.clone()).map_err(|e| {
        let path = e.path().to_string();
        vec![(if path == "." { String::new() } else { path }, e.into_inner().to_string())]
    })?;
    policy.validate().map_err(|v| {
        v.0.into_iter()
            .map(|e| {
                let msg =
                    if e.value.is_empty() { e.message } else { format!("{} (got {})", e.message, e.value) };
                (e.path, msg)
            })
            .collect::<Vec<_>>()
    })?;
    Ok(policy)
}

#[derive(Template)]
#[template(path = "policy_edit.html")]
struct EditPage {
    layout: Layout,
    env: String,
    svc: String,
    base: String,
    csrf: String,
    revision: u64,
    part: String,
    title: String,
    parts: Vec<(String, String)>,
    fields: Vec<Field>,
    raw: bool,
    raw_text: String,
    raw_format: String,
    /// Errors that belong to no field of the form.
    errors: Vec<(String, String)>,
    previewed: bool,
    diff: Vec<DiffRow>,
    lints: Vec<(String, String)>,
    /// The policy previewed, as the commit form carries it.
    commit: Option<String>,
    reason: String,
    note: Option<String>,
    /// Set when a policy change needs approval: what the commit form offers instead.
    gate: Option<Gate>,
}

/// One row of a diff table.
pub struct DiffRow {
    /// Dotted path.
    pub path: String,
    /// `added`, `removed` or `changed`.
    pub op: &'static str,
    /// JSON before, or empty.
    pub before: String,
    /// JSON after, or empty.
    pub after: String,
}

/// Rows of a diff table.
pub fn diff_rows(d: Vec<DiffEntry>) -> Vec<DiffRow> {
    let text = |v: Option<Value>| v.map(|v| v.to_string()).unwrap_or_default();
    d.into_iter()
        .map(|e| DiffRow { path: e.path, op: e.op, before: text(e.before), after: text(e.after) })
        .collect()
}

/// The stored policy of a service and its revision, as JSON with every default written out.
async fn current(s: &AppState, env: &str, svc: &str) -> Result<(u64, Policy, Value), UiError> {
    let row = s
        .store
        .service(env, svc)
        .await?
        .ok_or_else(|| UiError::NotFound(format!("no service {svc:?} in environment {env:?}")))?;
    let policy: Policy = serde_json::from_str(&row.policy)
        .map_err(|e| UiError::Internal(anyhow::anyhow!("stored policy does not decode: {e}")))?;
    let json = serde_json::to_value(&policy).map_err(|e| UiError::Internal(e.into()))?;
    Ok((row.revision, policy, json))
}

fn parts_of(policy: &Value) -> Vec<(String, String)> {
    let mut out = vec![Part::Service, Part::Inbound];
    if let Some(m) = policy["dependencies"].as_object() {
        out.extend(m.keys().map(|k| Part::Dependency(k.clone())));
    }
    if let Some(a) = policy["degradation_matrix"].as_array() {
        out.extend((0..a.len()).map(Part::Matrix));
    }
    out.push(Part::Raw);
    out.into_iter().map(|p| (p.key(), p.title(policy))).collect()
}

fn page(user: &UiUser, env: &str, svc: &str, revision: u64, part: &Part, policy: &Value) -> EditPage {
    EditPage {
        layout: user.layout(),
        env: env.to_string(),
        svc: svc.to_string(),
        base: service_url(env, svc),
        csrf: user.csrf.clone(),
        revision,
        part: part.key(),
        title: part.title(policy),
        parts: parts_of(policy),
        fields: if *part == Part::Raw { Vec::new() } else { fields(policy, part) },
        raw: *part == Part::Raw,
        raw_text: serde_json::to_string_pretty(policy).unwrap_or_default(),
        raw_format: "json".into(),
        errors: Vec::new(),
        previewed: false,
        diff: Vec::new(),
        lints: Vec::new(),
        commit: None,
        reason: String::new(),
        note: None,
        gate: None,
    }
}

/// Query of the editor.
#[derive(Debug, Deserialize)]
pub struct EditQuery {
    #[serde(default)]
    part: String,
}

/// `GET …/policy/edit?part=…`: the form of one part, with the current values.
pub async fn form(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, svc)): Path<(String, String)>,
    Query(q): Query<EditQuery>,
) -> Result<Response, UiError> {
    user.require(Action::PolicyUpdate)?;
    let (revision, _, json) = current(&s, &env, &svc).await?;
    let part = Part::parse(&q.part).ok_or_else(|| UiError::NotFound(format!("no part {:?}", q.part)))?;
    if part != Part::Raw && json.pointer(&part.pointer()).is_none() {
        return Err(UiError::NotFound(format!("the policy has no {}", part.title(&json))));
    }
    Ok(Page::ok(page(&user, &env, &svc, revision, &part, &json)).into_response())
}

/// `POST …/policy/preview`: what the typed values make of the policy — diff, inline
/// errors, lints — and the commit form when it is valid.
pub async fn preview(
    State(s): State<AppState>,
    Path((env, svc)): Path<(String, String)>,
    Posted { user, form }: Posted<Vec<(String, String)>>,
) -> Result<Response, UiError> {
    user.require(Action::PolicyUpdate)?;
    let get = |name: &str| posted(&form, name);
    let (revision, _, current_json) = current(&s, &env, &svc).await?;
    let seen: u64 = get("revision").and_then(|r| r.parse().ok()).unwrap_or(revision);
    let part = Part::parse(get("part").unwrap_or("")).unwrap_or(Part::Service);
    let mut view = page(&user, &env, &svc, seen, &part, &current_json);
    view.previewed = true;
    if seen != revision {
        view.note = Some(format!(
            "The service changed since this form was loaded (you saw revision {seen}, it is now at {revision}): the \
             diff below is against revision {revision}, and committing will be refused until you review it again."
        ));
    }
    let mut errors: Vec<(String, String)> = Vec::new();
    let candidate = if part == Part::Raw {
        let text = get("raw").unwrap_or("");
        let format = get("format").unwrap_or("json");
        view.raw_text = text.to_string();
        view.raw_format = format.to_string();
        if text.len() > MAX_RAW_POLICY_BYTES {
            errors.push((String::new(), format!("the policy is longer than {MAX_RAW_POLICY_BYTES} bytes")));
            None
        } else {
            let parsed = if format == "yaml" {
                serde_saphyr::from_str::<Value>(text).map_err(|e| format!("this is not YAML: {e}"))
            } else {
                serde_json::from_str::<Value>(text).map_err(|e| format!("this is not JSON: {e}"))
            };
            match parsed {
                Ok(v) => Some(v),
                Err(m) => {
                    errors.push((String::new(), m));
                    None
                }
            }
        }
    } else {
        let mut candidate = current_json.clone();
        for f in view.fields.iter_mut() {
            apply_typed(&mut candidate, f, &form);
        }
        retag(&mut view.fields, &mut candidate, &current_json, &part, &form);
        Some(candidate)
    };
    let typing_errors = view.fields.iter().any(|f| f.error.is_some());
    if let Some(candidate) = candidate.filter(|_| !typing_errors) {
        match check(&candidate) {
            Ok(policy) => {
                let after = serde_json::to_value(&policy).map_err(|e| UiError::Internal(e.into()))?;
                view.diff = diff_rows(json_diff(&current_json, &after));
                let lints: Vec<Lint> = crate::advice::for_service(&s.store, &env, &svc, &policy).await?;
                view.lints = lints.into_iter().map(|l| (l.path, l.message)).collect();
                if !view.diff.is_empty() && seen == revision {
                    view.commit = Some(after.to_string());
                    view.gate = approval::gate(&s, &user, &env, &[ChangeKind::Policy], true).await?;
                }
            }
            Err(found) => errors.extend(found),
        }
    }
    // Each error at its field; the rest above the form.
    for (path, message) in errors {
        match view.fields.iter_mut().find(|f| !path.is_empty() && f.path == path) {
            Some(f) => f.error = Some(message),
            None => view.errors.push((path, message)),
        }
    }
    let status = if view.errors.is_empty() && view.fields.iter().all(|f| f.error.is_none()) {
        StatusCode::OK
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    Ok(Page::with_status(status, view).into_response())
}

/// The value of form field `name`.
fn posted<'a>(form: &'a [(String, String)], name: &str) -> Option<&'a str> {
    form.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// Puts what was typed in field `f` (the form's `v:` and `k:` of its pointer) into
/// `candidate`; a value that does not read is the field's error. `false`: the form did not
/// have the field.
fn apply_typed(candidate: &mut Value, f: &mut Field, form: &[(String, String)]) -> bool {
    let kind = posted(form, &format!("k:{}", f.pointer)).unwrap_or(f.kind);
    let Some(text) = posted(form, &format!("v:{}", f.pointer)) else { return false };
    f.value = text.to_string();
    match typed(kind, text) {
        Ok(Value::Null) => remove(candidate, &f.pointer),
        Ok(v) => {
            if let Some(slot) = candidate.pointer_mut(&f.pointer) {
                *slot = v;
            }
        }
        Err(m) => f.error = Some(m),
    }
    true
}

/// When a tag of a tagged enumeration was changed (a breaker window's `type` from `count`
/// to `time`), its object takes the fields of the variant it now names (`schema::variant`):
/// fields the variant does not have are dropped, those it requires are offered, filled
/// from the form when it had them (a second preview) and otherwise named as required; the
/// form's fields follow.
fn retag(
    shown: &mut Vec<Field>,
    candidate: &mut Value,
    current: &Value,
    part: &Part,
    form: &[(String, String)],
) {
    let mut required: Vec<(String, String)> = Vec::new();
    let mut changed = false;
    for f in shown.iter().filter(|f| f.error.is_none()) {
        if candidate.pointer(&f.pointer) == current.pointer(&f.pointer) {
            continue;
        }
        let Some(tag) = candidate.pointer(&f.pointer).and_then(Value::as_str).map(str::to_string) else {
            continue;
        };
        let Some(variant) = super::schema::variant(&f.pointer, &tag) else { continue };
        let Some((parent, _)) = f.pointer.rsplit_once('/') else { continue };
        if let Some(Value::Object(m)) = candidate.pointer_mut(parent) {
            changed = true;
            m.retain(|k, _| variant.fields.contains(k));
            for r in &variant.required {
                if m.contains_key(r) {
                    continue;
                }
                m.insert(r.clone(), Value::Null);
                required.push((
                    format!("{parent}/{}", escape_token(r)),
                    format!("required when {} is {tag}", f.label),
                ));
            }
        }
    }
    if !changed {
        return;
    }
    let typed_before = std::mem::take(shown);
    *shown = fields(candidate, part);
    for f in shown.iter_mut() {
        if let Some(t) = typed_before.iter().find(|t| t.pointer == f.pointer) {
            f.value = t.value.clone();
            f.error = t.error.clone();
        } else if let Some((_, why)) = required.iter().find(|(p, _)| *p == f.pointer) {
            let given = apply_typed(candidate, f, form);
            if !given || candidate.pointer(&f.pointer).is_none_or(Value::is_null) {
                f.error.get_or_insert_with(|| why.clone());
            }
        }
    }
}

/// Removes the value at `pointer` (an optional field emptied).
fn remove(v: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else { return };
    if let Some(Value::Object(m)) = v.pointer_mut(parent) {
        m.remove(&unescape_token(last));
    }
}

/// Form of the commit step.
#[derive(Debug, Deserialize)]
pub struct Commit {
    /// The policy previewed (JSON).
    policy: String,
    /// The revision the preview was based on.
    revision: u64,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    part: String,
    /// The commit, its proposal, or break-glass.
    #[serde(default)]
    mode: Mode,
}

/// The preview of `policy` with its commit form again, the reason kept: after a reason
/// was refused (`error`), or after the commit was refused for want of approval (`gate`).
async fn commit_again(
    s: &AppState,
    user: &UiUser,
    (env, svc): (&str, &str),
    form: &Commit,
    policy: &Policy,
    error: Option<String>,
    gate: Option<Gate>,
) -> Result<Response, UiError> {
    let (revision, _, current_json) = current(s, env, svc).await?;
    let after = serde_json::to_value(policy).map_err(|e| UiError::Internal(e.into()))?;
    let part = Part::parse(&form.part).unwrap_or(Part::Service);
    // The form shows the values previewed, so previewing again keeps them.
    let mut view = page(user, env, svc, form.revision, &part, &after);
    view.previewed = true;
    view.diff = diff_rows(json_diff(&current_json, &after));
    view.commit = (form.revision == revision).then(|| after.to_string());
    view.reason = form.reason.clone();
    let status = match error {
        Some(msg) => {
            view.errors.push(("reason".into(), msg));
            view.gate = approval::gate(s, user, env, &[ChangeKind::Policy], true).await?;
            StatusCode::BAD_REQUEST
        }
        None => {
            view.gate = gate;
            StatusCode::FORBIDDEN
        }
    };
    Ok(Page::with_status(status, view).into_response())
}

/// `POST …/policy/commit`: replaces the policy with the one previewed, if the service is
/// still at the revision the preview was based on; or proposes it as a change request, or
/// applies it by break-glass, where policy changes need approval.
pub async fn commit(
    State(s): State<AppState>,
    rid: RequestId,
    Path((env, svc)): Path<(String, String)>,
    Posted { user, form }: Posted<Commit>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::PolicyUpdate, &rid)?;
    let candidate: Value = serde_json::from_str(&form.policy)
        .map_err(|e| UiError::BadRequest(format!("the previewed policy could not be read: {e}")))?;
    let policy = match check(&candidate) {
        Ok(p) => p,
        Err(errs) => {
            return Err(UiError::BadRequest(format!(
                "the previewed policy is not valid: {}",
                errs.into_iter().map(|(p, m)| format!("{p}: {m}")).collect::<Vec<_>>().join("; ")
            )));
        }
    };
    let reason = match reason(&form.reason) {
        Ok(r) => r,
        Err(msg) => return commit_again(&s, &user, (&env, &svc), &form, &policy, Some(msg), None).await,
    };
    if form.mode == Mode::Propose {
        // What the proposer reviewed is the difference from the revision previewed.
        let (revision, _, _) = current(&s, &env, &svc).await?;
        if revision != form.revision {
            return Err(ChangeError::Conflict { expected: form.revision, current: revision }.into());
        }
        let p = Proposal::Policy { service: svc.clone(), policy: Box::new(policy) };
        let r = s.actions.propose(&by, &reason, &env, p).await?;
        return Ok(approval::proposed(&env, r.id));
    }
    let by = form.mode.actor(by, &reason);
    let at = ServiceAt::new(&env, &svc, Some(form.revision));
    let w = match s.actions.update_policy(&by, &reason, &at, policy.clone()).await {
        Ok(w) => w,
        Err(e @ ChangeError::ApprovalRequired { .. }) => {
            let gate = approval::refused(e, &user, true)?;
            return commit_again(&s, &user, (&env, &svc), &form, &policy, None, Some(gate)).await;
        }
        Err(e) => return Err(e.into()),
    };
    tracing::info!(actor = ?by.name, environment = ?env, service = ?svc, revision = w.snapshot.revision, "policy edited from the UI");
    Ok(super::changes::after_change(&env, &svc, &w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_leaf_of_a_dependency_is_a_field_with_its_error_path() {
        let policy: Policy = serde_json::from_value(serde_json::json!({
            "dependencies": {"pay.v2": {"attempt_timeout": "80ms", "enabled_flag": "pay.enabled"}},
            "degradation_matrix": [{"feature": "cart", "dependencies": ["pay.v2"], "on_failure": "generic"}]
        }))
        .unwrap();
        let json = serde_json::to_value(&policy).unwrap();
        let f = fields(&json, &Part::Dependency("pay.v2".into()));
        let timeout = f.iter().find(|f| f.label == "Attempt timeout").unwrap();
        assert_eq!(timeout.pointer, "/dependencies/pay.v2/attempt_timeout");
        assert_eq!(timeout.path, "dependencies.pay.v2.attempt_timeout");
        assert_eq!((timeout.kind, timeout.value.as_str()), ("s", "80ms"));
        let attempts = f.iter().find(|f| f.label == "Retry › Max attempts").unwrap();
        assert_eq!(attempts.kind, "n");
        let m = fields(&json, &Part::Matrix(0));
        let deps = m.iter().find(|f| f.label == "Dependencies").unwrap();
        assert_eq!(
            (deps.kind, deps.path.as_str(), deps.value.as_str()),
            ("l", "degradation_matrix[0].dependencies", "pay.v2")
        );
        let top = fields(&json, &Part::Service);
        assert!(top.iter().any(|f| f.label == "Default deadline"));
        assert!(top.iter().all(|f| !f.label.contains('›')), "only the top level");
    }

    #[test]
    fn decoding_and_validation_errors_name_their_field() {
        let mut v = serde_json::to_value(Policy::default()).unwrap();
        v["dependencies"] = serde_json::json!({"pay": {"attempt_timeout": "fast"}});
        let errs = check(&v).unwrap_err();
        assert_eq!(errs[0].0, "dependencies.pay.attempt_timeout", "{errs:?}");
        v["dependencies"] = serde_json::json!({"pay": {"retry": {"max_attempts": 0}}});
        let errs = check(&v).unwrap_err();
        assert!(errs.iter().any(|(p, _)| p == "dependencies.pay.retry.max_attempts"), "{errs:?}");
        assert_eq!(typed("n", "ten").unwrap_err(), "\"ten\" is not a number");
        assert_eq!(typed("l", "a, b,,").unwrap(), serde_json::json!(["a", "b"]));
        assert_eq!(typed("s", "").unwrap(), Value::Null);
    }
}
