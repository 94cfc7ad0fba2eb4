//! The OpenAPI document, generated from the handlers' annotations.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{audit, auth_routes, envs, flags, fleet, overrides, plan, services, tokens};

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("JWT").build(),
            ),
        );
    }
}

/// The API description.
#[derive(OpenApi)]
#[openapi(
    info(title = "Levee API", description = "Resilience policies and kill switches: environments, services, \
        policies, flags, breaker overrides, fault rules, history, audit, fleet, tokens."),
    paths(
        auth_routes::login, auth_routes::logout,
        envs::list, envs::create, envs::get_one,
        services::list, services::create, services::get_one, services::get_policy, services::put_policy,
        services::get_snapshot, services::get_lint, services::list_revisions, services::get_revision,
        services::diff_revision, services::rollback,
        flags::list, flags::get_one, flags::put, flags::patch, flags::delete,
        overrides::list_overrides, overrides::put_override, overrides::delete_override,
        overrides::list_faults, overrides::put_fault, overrides::delete_fault,
        fleet::agents, fleet::nacks,
        fleet::propagation,
        audit::list,
        tokens::create, tokens::list, tokens::revoke, tokens::list_users, tokens::create_user,
        services::put_service, services::delete_service, plan::plan,
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
#[derive(Debug)]
pub struct ApiDoc;

/// `GET /api/v1/openapi.json` (no authentication needed).
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
