//! The OpenAPI document, generated from the handlers' annotations.

use axum::Json;
use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr, Response};
use utoipa::{Modify, OpenApi};

use super::{
    agent_sync, audit, auth_routes, envs, flags, fleet, ofrep, overrides, plan, profiles, requests, rollouts,
    schedule, services, tokens,
};

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

/// Operations that need no token.
pub const PUBLIC_PATHS: &[&str] = &["/api/v1/auth/login", "/api/v1/openapi.json"];

/// Every error of every operation, as the server answers it: `application/problem+json`
/// with the [`Problem`](super::Problem) schema, including the errors every operation can
/// give without its handler saying so (a malformed request, no or a bad token, a role too
/// low, an unknown resource, a body too large or not JSON, the database unreachable).
/// Operations that need no token say so (`security: []`).
struct ProblemResponses;

impl ProblemResponses {
    fn common(path: &str, has_body: bool) -> Vec<(&'static str, &'static str)> {
        let public = PUBLIC_PATHS.contains(&path);
        let mut out = vec![("400", "malformed request: the problem names the parameter or field")];
        if !public {
            out.push(("401", "no token, or a token that is expired, revoked or not valid here"));
            out.push(("403", "the caller's role does not allow this"));
        }
        if path.contains('{') {
            out.push(("404", "no such resource"));
        }
        if has_body {
            out.push(("413", "the body is larger than the server's limit"));
            out.push(("415", "the body is not JSON"));
            out.push(("422", "the body is JSON but a value is not allowed; every bad field is listed"));
        }
        if path == "/api/v1/auth/login" {
            out.push(("429", "too many failed logins for this user; try later"));
        }
        if path != "/api/v1/openapi.json" {
            out.push(("503", "the database is unreachable; retry later"));
        }
        out
    }
}

impl Modify for ProblemResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let problem = || RefOr::T(Content::new(Some(RefOr::Ref(Ref::from_schema_name("Problem")))));
        for (path, item) in openapi.paths.paths.iter_mut() {
            let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
            for op in ops.into_iter().flatten() {
                if PUBLIC_PATHS.contains(&path.as_str()) {
                    op.security = Some(Vec::<SecurityRequirement>::new());
                }
                for param in op.parameters.iter_mut().flatten() {
                    if let RefOr::T(p) = param
                        && let Some(example) = path_example(&p.name)
                        && matches!(p.parameter_in, ParameterIn::Path)
                    {
                        *p = ParameterBuilder::from(p.clone()).example(Some(example)).build();
                    }
                }
                for (status, response) in op.responses.responses.iter_mut() {
                    if status.as_str() >= "400"
                        && let RefOr::T(r) = response
                    {
                        r.content.shift_remove("application/json");
                        r.content.insert(super::PROBLEM_JSON.to_string(), problem());
                    }
                }
                for (status, description) in Self::common(path, op.request_body.is_some()) {
                    op.responses.responses.entry(status.to_string()).or_insert_with(|| {
                        let mut r = Response::new(description);
                        r.content.insert(super::PROBLEM_JSON.to_string(), problem());
                        RefOr::T(r)
                    });
                }
            }
        }
    }
}

/// Example values of path parameters, naming what the API's own examples use (environment
/// `prod`, service `checkout`, flag `beta`, dependency `payments`, revision 1), so a client
/// generated from the document — or a fuzzer — reaches real resources.
fn path_example(name: &str) -> Option<serde_json::Value> {
    Some(match name {
        "env" => "prod".into(),
        "svc" => "checkout".into(),
        "key" => "beta".into(),
        "dep" => "payments".into(),
        "rev" => 1.into(),
        "username" => "admin".into(),
        _ => return None,
    })
}

/// The API description.
#[derive(OpenApi)]
#[openapi(
    info(title = "Levee API", description = "Resilience policies and kill switches: environments, services, \
        policies, flags, breaker overrides, fault rules, history, audit, fleet, tokens, and flag \
        evaluation over OFREP (base URL `/api/v1`, with a flags token)."),
    paths(
        auth_routes::login, auth_routes::logout,
        envs::list, envs::create, envs::get_one,
        services::list, services::create, services::get_one, services::get_policy, services::put_policy,
        services::get_snapshot, services::get_lint, services::list_revisions, services::get_revision,
        services::diff_revision, services::rollback,
        flags::list, flags::get_one, flags::put, flags::patch, flags::delete, flags::temporary,
        overrides::list_overrides, overrides::put_override, overrides::delete_override,
        overrides::list_faults, overrides::put_fault, overrides::delete_fault,
        fleet::agents, fleet::nacks, agent_sync::poll,
        ofrep::evaluate_one, ofrep::evaluate_all,
        fleet::propagation,
        audit::list,
        tokens::create, tokens::list, tokens::revoke, tokens::list_users, tokens::create_user,
        services::put_service, services::delete_service, plan::plan,
        profiles::list, profiles::get_one, profiles::put, profiles::delete, profiles::apply,
        profiles::active, profiles::activations, profiles::revert,
        schedule::list, schedule::get_one, schedule::create, schedule::reschedule, schedule::cancel,
        requests::get_rules, requests::put_rules, requests::list, requests::get_one, requests::create,
        requests::edit, requests::approve, requests::reject, requests::apply,
        rollouts::get_settings, rollouts::put_settings, rollouts::list, rollouts::get_one, rollouts::promote,
        rollouts::pause, rollouts::resume, rollouts::abort,
        tokens::update_user, document,
    ),
    modifiers(&BearerAuth, &ProblemResponses),
    security(("bearer" = [])),
)]
#[derive(Debug)]
pub struct ApiDoc;

/// This OpenAPI document (no token needed).
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "the OpenAPI 3.1 document of the API", content_type = "application/json")))]
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
