//! Creating an environment (admin) and a service (operator) from the browser, each a page
//! with its form and a reason; a refused form comes back as typed, with what is wrong.
//!
//! A new service starts with the default policy and no flag: its page then offers "edit
//! the policy" and "Add a flag…", the same forms as for any service.

use askama::Template;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use levee_agent::policy::Policy;
use serde::Deserialize;

use super::error::UiError;
use super::page::{Layout, Page, seg, service_url};
use super::session::{Posted, UiUser, reason};
use crate::actions::{Action, CreateError, NewEnvironment, NewService};
use crate::web::{AppState, RequestId};

/// What is created: an environment, or a service of `env`.
#[derive(Template)]
#[template(path = "create.html")]
struct CreatePage {
    layout: Layout,
    csrf: String,
    /// `None` for an environment.
    env: Option<String>,
    form: CreateForm,
    error: Option<String>,
}

/// Form creating an environment or a service.
#[derive(Debug, Default, Deserialize)]
pub struct CreateForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
    /// Environment only: fault injection allowed (a checkbox).
    #[serde(default)]
    allow_faults: Option<String>,
    #[serde(default)]
    reason: String,
}

fn page(user: &UiUser, env: Option<String>, form: CreateForm, error: Option<String>) -> Response {
    let status = if error.is_some() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    Page::with_status(status, CreatePage { layout: user.layout(), csrf: user.csrf.clone(), env, form, error })
        .into_response()
}

/// What the form says about a refused creation; storage failures stay errors.
fn says(e: CreateError) -> Result<String, UiError> {
    match e {
        CreateError::Storage(cause) => Err(UiError::Internal(cause)),
        CreateError::Forbidden(f) => Err(f.into()),
        e => Ok(e.to_string()),
    }
}

/// `GET /ui/new-environment`.
pub async fn environment_form(user: UiUser) -> Result<Response, UiError> {
    user.require(Action::EnvironmentCreate)?;
    Ok(page(&user, None, CreateForm::default(), None))
}

/// `POST /ui/environments`: creates an environment.
pub async fn create_environment(
    State(s): State<AppState>,
    rid: RequestId,
    Posted { user, form }: Posted<CreateForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::EnvironmentCreate, &rid)?;
    let checked = NewEnvironment::new(
        form.name.trim(),
        form.description.trim().to_string(),
        form.allow_faults.is_some(),
    )
    .map_err(|e| e.to_string())
    .and_then(|new| Ok((new, reason(&form.reason)?)));
    let (new, why) = match checked {
        Ok(c) => c,
        Err(m) => return Ok(page(&user, None, form, Some(m))),
    };
    match s.actions.create_environment(&by, &why, new).await {
        Ok(e) => Ok(Redirect::to(&format!("/ui/environments/{}", seg(&e.name))).into_response()),
        Err(e) => Ok(page(&user, None, form, Some(says(e)?))),
    }
}

/// `GET /ui/environments/{env}/new-service`.
pub async fn service_form(
    State(s): State<AppState>,
    user: UiUser,
    Path(env): Path<String>,
) -> Result<Response, UiError> {
    user.require(Action::ServiceCreate)?;
    s.store.environment(&env).await?.ok_or_else(|| UiError::NotFound(format!("no environment {env:?}")))?;
    Ok(page(&user, Some(env), CreateForm::default(), None))
}

/// `POST /ui/environments/{env}/services`: creates a service with the default policy.
pub async fn create_service(
    State(s): State<AppState>,
    rid: RequestId,
    Path(env): Path<String>,
    Posted { user, form }: Posted<CreateForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::ServiceCreate, &rid)?;
    let checked = NewService::new(
        form.name.trim(),
        form.description.trim().to_string(),
        Policy::default(),
        Default::default(),
    )
    .map_err(|e| e.to_string())
    .and_then(|new| Ok((new, reason(&form.reason)?)));
    let (new, why) = match checked {
        Ok(c) => c,
        Err(m) => return Ok(page(&user, Some(env), form, Some(m))),
    };
    let name = new.name.to_string();
    match s.actions.create_service(&by, &why, &env, new).await {
        Ok(_) => Ok(Redirect::to(&service_url(&env, &name)).into_response()),
        Err(e) => Ok(page(&user, Some(env), form, Some(says(e)?))),
    }
}
