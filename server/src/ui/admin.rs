//! `GET /ui/admin`: users and tokens (admin). Create a user; change a user's role or
//! disable / enable it (a confirmation page says what happens, then the change ends the
//! user's sessions); mint an API or agent token — its secret is shown once, on the page
//! answering the form, and never again; list and revoke tokens. Each change is the same
//! action as the API's, audited with `via = "ui"`.

use askama::Template;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::error::UiError;
use super::page::{Layout, Page, When, seg, time};
use super::session::{Posted, UiUser, reason};
use crate::actions::{Action, CreateError, NewToken, NewUser, TokenError, UserChange};
use crate::db::{Role, TokenKind};
use crate::web::{AppState, RequestId};

struct UserView {
    name: String,
    role: &'static str,
    disabled: bool,
    created: When,
}

struct TokenView {
    id: String,
    kind: &'static str,
    name: String,
    scope: String,
    by: String,
    expires: When,
    revoked: Option<When>,
}

#[derive(Template)]
#[template(path = "admin.html")]
struct AdminPage {
    layout: Layout,
    csrf: String,
    users: Vec<UserView>,
    tokens: Vec<TokenView>,
    /// A token just minted: (name, secret), shown this once.
    minted: Option<(String, String)>,
    notice: Option<String>,
    error: Option<String>,
}

/// Query after a change.
#[derive(Debug, Deserialize)]
pub struct DoneQuery {
    done: Option<String>,
}

async fn render(
    s: &AppState,
    user: &UiUser,
    minted: Option<(String, String)>,
    notice: Option<String>,
    error: Option<String>,
) -> Result<Response, UiError> {
    user.require_role(Role::Admin, "the users and tokens page")?;
    let users = s
        .store
        .users()
        .await?
        .into_iter()
        .map(|u| UserView {
            name: u.username,
            role: u.role.as_str(),
            disabled: u.disabled,
            created: time(u.created_at),
        })
        .collect();
    let now = crate::db::now_ms();
    let tokens = s
        .store
        .tokens()
        .await?
        .into_iter()
        .map(|t| TokenView {
            scope: match t.kind {
                TokenKind::Api => format!("role {}", t.role.map_or("viewer", Role::as_str)),
                TokenKind::Agent | TokenKind::Flags => {
                    format!("{} / {}", t.environment.clone().unwrap_or_default(), t.services.join(", "))
                }
            },
            // A rotated token works until its overlap ends: that is when it expires, and it
            // is not shown revoked (nor without its revoke button) before then.
            expires: time(t.ends_at()),
            revoked: t.revoked_at.filter(|_| t.revoked(now)).map(time),
            id: t.id,
            kind: t.kind.as_str(),
            name: t.name,
            by: t.created_by,
        })
        .collect();
    let status = if error.is_some() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    let page =
        AdminPage { layout: user.layout(), csrf: user.csrf.clone(), users, tokens, minted, notice, error };
    Ok(Page::with_status(status, page).into_response())
}

fn done(msg: &str) -> Response {
    Redirect::to(&format!("/ui/admin?done={}", seg(msg))).into_response()
}

/// `GET /ui/admin`.
pub async fn page(
    State(s): State<AppState>,
    user: UiUser,
    axum::extract::Query(q): axum::extract::Query<DoneQuery>,
) -> Result<Response, UiError> {
    render(&s, &user, None, q.done, None).await
}

/// Form creating a user.
#[derive(Debug, Deserialize)]
pub struct UserForm {
    username: String,
    password: String,
    role: String,
    #[serde(default)]
    reason: String,
}

/// `POST /ui/admin/users`.
pub async fn create_user(
    State(s): State<AppState>,
    rid: RequestId,
    Posted { user, form }: Posted<UserForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::UserCreate, &rid)?;
    let parsed = reason(&form.reason).and_then(|r| {
        let role = Role::parse(&form.role)
            .ok_or(format!("role {:?} is not viewer, operator or admin", form.role))?;
        let new =
            NewUser::new(form.username.trim(), form.password.clone(), role).map_err(|e| e.to_string())?;
        Ok((r, new))
    });
    let (why, new) = match parsed {
        Ok(p) => p,
        Err(m) => return render(&s, &user, None, None, Some(m)).await,
    };
    match s.actions.create_user(&by, &why, new).await {
        Ok(()) => Ok(done(&format!("Created user {}", form.username.trim()))),
        Err(CreateError::AlreadyExists(e)) => render(&s, &user, None, None, Some(e.to_string())).await,
        Err(e) => Err(e.into()),
    }
}

/// Form minting a token.
#[derive(Debug, Deserialize)]
pub struct TokenForm {
    /// `api` or `agent`.
    kind: String,
    name: String,
    /// Role of an API token.
    #[serde(default)]
    role: String,
    /// Environment of an agent token.
    #[serde(default)]
    environment: String,
    /// Services of an agent token, comma-separated.
    #[serde(default)]
    services: String,
    /// Lifetime, e.g. `90d`; empty for the default.
    #[serde(default)]
    expires_in: String,
    #[serde(default)]
    reason: String,
}

fn parse_token(f: &TokenForm) -> Result<NewToken, String> {
    let kind = match f.kind.as_str() {
        "api" => TokenKind::Api,
        "agent" => TokenKind::Agent,
        "flags" => TokenKind::Flags,
        k => return Err(format!("kind {k:?} is not api, agent or flags")),
    };
    let role = match (kind, f.role.trim()) {
        (TokenKind::Api, r) if !r.is_empty() => {
            Some(Role::parse(r).ok_or(format!("role {r:?} is not viewer, operator or admin"))?)
        }
        _ => None,
    };
    let env = f.environment.trim();
    let env = (kind != TokenKind::Api && !env.is_empty()).then_some(env);
    let services: Vec<String> =
        f.services.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
    let ttl = match f.expires_in.trim() {
        "" => None,
        t => Some(levee_agent::policy::duration::parse(t).map_err(|m| format!("expires in: {m}"))?),
    };
    NewToken::new(kind, f.name.trim(), role, env, &services, ttl).map_err(|e| e.to_string())
}

/// `POST /ui/admin/tokens`: mints a token and shows its secret once.
pub async fn mint(
    State(s): State<AppState>,
    rid: RequestId,
    Posted { user, form }: Posted<TokenForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::TokenCreate, &rid)?;
    let parsed = reason(&form.reason).and_then(|r| Ok((r, parse_token(&form)?)));
    let (why, new) = match parsed {
        Ok(p) => p,
        Err(m) => return render(&s, &user, None, None, Some(m)).await,
    };
    match s.actions.create_token(&by, &why, new).await {
        Ok(m) => render(&s, &user, Some((m.row.name, m.token)), None, None).await,
        Err(TokenError::InvalidField(f)) => render(&s, &user, None, None, Some(f.to_string())).await,
        Err(e) => Err(e.into()),
    }
}

/// Form revoking a token.
#[derive(Debug, Deserialize)]
pub struct RevokeForm {
    id: String,
    #[serde(default)]
    reason: String,
}

/// `POST /ui/admin/tokens/revoke`.
pub async fn revoke(
    State(s): State<AppState>,
    rid: RequestId,
    Posted { user, form }: Posted<RevokeForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::TokenRevoke, &rid)?;
    let why = match reason(&form.reason) {
        Ok(r) => r,
        Err(m) => return render(&s, &user, None, None, Some(m)).await,
    };
    s.actions.revoke_token(&by, &why, &form.id).await?;
    Ok(done(&format!("Revoked token {}", form.id)))
}

/// Form changing a user (its confirmation, then the change itself with a reason).
#[derive(Debug, Deserialize)]
pub struct UserEditForm {
    username: String,
    /// `viewer`, `operator` or `admin`.
    role: String,
    /// `active` or `disabled`.
    state: String,
    #[serde(default)]
    reason: String,
}

#[derive(Template)]
#[template(path = "user_confirm.html")]
struct UserConfirmPage {
    layout: Layout,
    csrf: String,
    username: String,
    role: String,
    state: String,
    effects: Vec<String>,
    reason: String,
    error: Option<String>,
}

/// What `form` changes of the user as stored: the new role and disabled flag (`None` when
/// unchanged) and the effects in words.
async fn user_change(
    s: &AppState,
    form: &UserEditForm,
) -> Result<Result<(Option<Role>, Option<bool>, Vec<String>), String>, UiError> {
    let name = form.username.trim();
    let Some(current) = s.store.user(name).await? else {
        return Err(UiError::NotFound(format!("no user {name:?}")));
    };
    let Some(role) = Role::parse(&form.role) else {
        return Ok(Err(format!("role {:?} is not viewer, operator or admin", form.role)));
    };
    let disabled = match form.state.as_str() {
        "active" => false,
        "disabled" => true,
        other => return Ok(Err(format!("state {other:?} is not active or disabled"))),
    };
    let mut effects = Vec::new();
    let role = (role != current.role).then(|| {
        effects.push(format!("role {} → {}", current.role.as_str(), role.as_str()));
        role
    });
    let disabled = (disabled != current.disabled).then(|| {
        effects.push(if disabled {
            format!("{name} is disabled: it cannot log in until an admin enables it again")
        } else {
            format!("{name} is enabled: it can log in again")
        });
        disabled
    });
    if effects.is_empty() {
        return Ok(Err(format!("nothing to change: {name} already has this role and state")));
    }
    effects.push(format!("every session {name} has open ends now"));
    Ok(Ok((role, disabled, effects)))
}

/// `POST /ui/admin/users/confirm`: what changing the user does; asks for a reason.
pub async fn confirm_user(
    State(s): State<AppState>,
    rid: RequestId,
    Posted { user, form }: Posted<UserEditForm>,
) -> Result<Response, UiError> {
    user.actor(Action::UserUpdate, &rid)?;
    match user_change(&s, &form).await? {
        Err(m) => render(&s, &user, None, None, Some(m)).await,
        Ok((_, _, effects)) => Ok(Page::ok(confirm_page(&user, &form, effects, None)).into_response()),
    }
}

fn confirm_page(
    user: &UiUser,
    form: &UserEditForm,
    effects: Vec<String>,
    error: Option<String>,
) -> UserConfirmPage {
    UserConfirmPage {
        layout: user.layout(),
        csrf: user.csrf.clone(),
        username: form.username.trim().to_string(),
        role: form.role.clone(),
        state: form.state.clone(),
        effects,
        reason: form.reason.clone(),
        error,
    }
}

/// `POST /ui/admin/users/update`: changes the user's role and/or state as confirmed.
pub async fn update_user(
    State(s): State<AppState>,
    rid: RequestId,
    Posted { user, form }: Posted<UserEditForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::UserUpdate, &rid)?;
    let (role, disabled, effects) = match user_change(&s, &form).await? {
        Ok(c) => c,
        Err(m) => return render(&s, &user, None, None, Some(m)).await,
    };
    let why = match reason(&form.reason) {
        Ok(r) => r,
        Err(m) => {
            let page = confirm_page(&user, &form, effects, Some(m));
            return Ok(Page::with_status(StatusCode::BAD_REQUEST, page).into_response());
        }
    };
    let name = form.username.trim();
    let change = match UserChange::new(name, None, role, disabled) {
        Ok(c) => c,
        Err(e) => return render(&s, &user, None, None, Some(e.to_string())).await,
    };
    match s.actions.update_user(&by, &why, change).await {
        Ok(()) => Ok(done(&format!("Changed user {name}: {}", effects.join("; ")))),
        Err(TokenError::InvalidField(f)) => render(&s, &user, None, None, Some(f.to_string())).await,
        Err(e) => Err(e.into()),
    }
}
