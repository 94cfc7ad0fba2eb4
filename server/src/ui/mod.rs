//! The operator web UI: server-rendered askama pages (templates in `web/templates/`) that
//! work without JavaScript.
//!
//! The UI reads through the same [`Store`](crate::db::Store) as the API and changes things
//! only through the same [`actions`](crate::actions), so a change made here is versioned,
//! validated, audited (`via = "ui"`), checked against the same roles and pushed to agents
//! exactly like an API change.
//!
//! Sessions are the `levee_session` cookie (HttpOnly, SameSite=Strict, Secure over TLS)
//! holding the session JWT. Forms are protected against cross-site request forgery twice:
//! tower-http's [`CsrfLayer`] refuses a state-changing request a browser marks as
//! cross-site (`Sec-Fetch-Site`, else `Origin` against `Host`), and every form carries a
//! token bound to the session (an HMAC of the session id under the JWT key) that
//! [`session::Posted`] checks before the handler runs. Every change asks for a
//! confirmation and a reason first (see `changes.rs`).

mod admin;
mod admission;
mod alarms;
mod approval;
mod audit;
mod changes;
mod create;
mod edit;
mod error;
mod experiments;
mod faults;
mod fleet;
mod history;
mod live;
mod login;
mod overview;
mod page;
mod profile_form;
mod profiles;
mod review;
mod rollouts;
mod schema;
mod service;
mod session;
mod status;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, header};
use axum::routing::{get, post};
use tower_http::csrf::CsrfLayer;
use tower_http::set_header::SetResponseHeaderLayer;

pub use error::UiError;
pub use session::{Posted, UiUser};

use crate::web::AppState;

/// Content-Security-Policy of every UI response: scripts, styles and images only from this
/// origin (the one script, `live.js`, follows a live page's server-sent events and swaps in
/// the page's sections as the server rendered them: no inline script, no `eval`), connections only back to this origin, forms only to it,
/// never framed (so a switch cannot be click-jacked).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; \
     style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Routes of the UI.
pub fn router(state: AppState) -> Router {
    let svc = "/ui/environments/{env}/services/{svc}";
    let headers = [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    let mut router = Router::new()
        .route("/", get(overview::environments))
        .route("/login", get(login::form).post(login::submit))
        .route("/logout", post(login::logout))
        .route("/static/levee.css", get(page::stylesheet))
        .route("/static/live.js", get(page::live_script))
        .route("/ui/audit", get(audit::page))
        .route("/ui/admin", get(admin::page))
        .route("/ui/admin/users", post(admin::create_user))
        .route("/ui/admin/users/confirm", post(admin::confirm_user))
        .route("/ui/admin/users/update", post(admin::update_user))
        .route("/ui/admin/tokens", post(admin::mint))
        .route("/ui/admin/tokens/revoke", post(admin::revoke))
        .route("/ui/live", get(live::overview))
        .route("/ui/new-environment", get(create::environment_form))
        .route("/ui/environments", post(create::create_environment))
        .route("/ui/environments/{env}/new-service", get(create::service_form))
        .route("/ui/environments/{env}/services", post(create::create_service))
        .route("/ui/environments/{env}", get(overview::services))
        .route("/ui/environments/{env}/live", get(live::environment))
        .route(svc, get(service::page))
        .route("/ui/environments/{env}/profiles", get(profiles::page).post(profiles::save))
        .route("/ui/environments/{env}/profiles/revert", post(profiles::revert))
        .route("/ui/environments/{env}/profiles/build", post(profiles::build))
        .route("/ui/environments/{env}/faults", get(faults::page).post(faults::create))
        .route("/ui/environments/{env}/faults/{svc}/{id}/end", post(faults::end))
        .route("/ui/environments/{env}/experiments", get(experiments::list).post(experiments::start))
        .route("/ui/environments/{env}/experiments/new", get(experiments::new))
        .route("/ui/environments/{env}/experiments/confirm", post(experiments::confirm))
        .route("/ui/environments/{env}/experiments/{id}", get(experiments::page))
        .route(
            "/ui/environments/{env}/experiments/{id}/stop",
            get(experiments::confirm_stop).post(experiments::stop),
        )
        .route("/ui/environments/{env}/scheduled", get(review::scheduled).post(review::schedule))
        .route("/ui/environments/{env}/scheduled/{id}/cancel", post(review::cancel))
        .route("/ui/environments/{env}/requests", get(review::requests).post(review::propose))
        .route("/ui/environments/{env}/requests/{id}", post(review::decide))
        .route("/ui/environments/{env}/approval-rules", get(approval::rules).post(approval::set_rules))
        .route("/ui/environments/{env}/rollouts/{id}", get(rollouts::page).post(rollouts::step))
        .route("/ui/environments/{env}/rollouts/{id}/confirm", get(rollouts::confirm))
        .route("/ui/environments/{env}/profiles/{name}/confirm", get(profiles::confirm))
        .route("/ui/environments/{env}/profiles/{name}/apply", post(profiles::apply))
        .route(&format!("{svc}/flags/{{key}}/confirm"), get(changes::confirm_flag))
        .route(&format!("{svc}/flags/{{key}}"), post(changes::apply_flag))
        .route(&format!("{svc}/flags/{{key}}/delete/confirm"), get(changes::confirm_delete_flag))
        .route(&format!("{svc}/flags/{{key}}/delete"), post(changes::apply_delete_flag))
        .route(&format!("{svc}/new-flag/confirm"), get(changes::confirm_new_flag))
        .route(&format!("{svc}/new-flag"), post(changes::apply_new_flag))
        .route(&format!("{svc}/breakers/confirm"), get(changes::confirm_override))
        .route(&format!("{svc}/breakers"), post(changes::apply_override))
        .route(&format!("{svc}/breakers/remove/confirm"), get(changes::confirm_remove_override))
        .route(&format!("{svc}/breakers/remove"), post(changes::apply_remove_override))
        .route(&format!("{svc}/policy/edit"), get(edit::form))
        .route(&format!("{svc}/policy/preview"), post(edit::preview))
        .route(&format!("{svc}/policy/commit"), post(edit::commit))
        .route(&format!("{svc}/history"), get(history::page))
        .route(&format!("{svc}/live"), get(live::events))
        .route(&format!("{svc}/rollback/confirm"), get(history::confirm))
        .route(&format!("{svc}/rollback"), post(history::apply))
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .layer(CsrfLayer::new().with_rejection_response(error::cross_site));
    for (name, value) in headers {
        router = router.layer(SetResponseHeaderLayer::if_not_present(name, HeaderValue::from_static(value)));
    }
    router.with_state(state)
}
