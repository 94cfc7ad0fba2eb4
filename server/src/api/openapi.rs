//! The OpenAPI document, generated from the handlers' annotations.

use axum::Json;
use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{AdditionalProperties, Schema, SchemaType, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr, Response};
use utoipa::{Modify, OpenApi};

use crate::actions::{MAX_TEXT_CHARS, NAME_PATTERN, REASON_PATTERN};
use crate::auth::{MAX_PASSWORD_CHARS, MIN_PASSWORD_CHARS};
use crate::db::ChangeKind;

use super::services::IF_MATCH_PATTERN;

use super::{
    agent_sync, audit, auth_routes, envs, experiments, flags, fleet, health, ofrep, overrides, plan,
    profiles, requests, rollouts, schedule, services, tokens,
};

/// Writes the defaults of duration fields as durations (`"15s"`): the schema derive prints
/// a field's default with the Rust type's own serde form (`{"secs": 15, "nanos": 0}`), not
/// with the field's `serde(with)` the server reads it through, and the server refuses that
/// object. Every `default` holding exactly `secs` and `nanos` is rewritten with the agent's
/// duration formatter, so the defaults stay where they are defined (the agent's model).
struct DurationDefaults;

impl Modify for DurationDefaults {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let Some(components) = openapi.components.as_mut() else { return };
        for schema in components.schemas.values_mut() {
            let Ok(mut v) = serde_json::to_value(&*schema) else { continue };
            if rewrite_duration_defaults(&mut v) {
                if let Ok(fixed) = serde_json::from_value(v) {
                    *schema = fixed;
                }
            }
        }
    }
}

/// Rewrites every `default` under `v` that is serde's form of a `std::time::Duration`;
/// whether any was.
fn rewrite_duration_defaults(v: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    let mut changed = false;
    match v {
        Value::Object(m) => {
            if let Some(d) = m.get_mut("default") {
                let parts = d.as_object().filter(|o| o.len() == 2).and_then(|o| {
                    Some(std::time::Duration::new(o.get("secs")?.as_u64()?, o.get("nanos")?.as_u64()? as u32))
                });
                if let Some(dur) = parts {
                    *d = Value::String(levee_agent::policy::duration::format(dur));
                    changed = true;
                }
            }
            for child in m.values_mut() {
                changed |= rewrite_duration_defaults(child);
            }
        }
        Value::Array(a) => {
            for child in a {
                changed |= rewrite_duration_defaults(child);
            }
        }
        _ => {}
    }
    changed
}

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
    fn common(path: &str, has_body: bool, needs_if_match: bool) -> Vec<(&'static str, &'static str)> {
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
        if needs_if_match {
            out.push(("428", "If-Match is missing: send the revision read, or * to write whatever it is"));
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
                let needs_if_match = op.parameters.iter().flatten().any(|p| {
                    matches!(p, RefOr::T(p) if matches!(p.parameter_in, ParameterIn::Header)
                        && p.name.eq_ignore_ascii_case("if-match")
                        && matches!(p.required, utoipa::openapi::Required::True))
                });
                for (status, description) in Self::common(path, op.request_body.is_some(), needs_if_match) {
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

/// The forms of free text and names that the server checks before anything else
/// (`actions::input`), stated in the document so that a client — or a fuzzer — knows what is
/// accepted: a value in this form is never refused with 400, one outside it always is.
///
/// * `reason` and `override_profile`, in any request body or query: [`REASON_PATTERN`],
///   1 to [`MAX_TEXT_CHARS`] characters (a query's `reason` is required where it is named);
/// * `kind` of a change request or scheduled change, and the `kinds` of approval rules: one
///   of [`ChangeKind::ALL`];
/// * a new `password`: `MIN_PASSWORD_CHARS` to `MAX_PASSWORD_CHARS` characters;
/// * `If-Match`: [`IF_MATCH_PATTERN`];
/// * the `description` of what is created: at most [`MAX_TEXT_CHARS`] characters;
/// * a page's `limit`: 1 to `MAX_PAGE`;
/// * names checked by `Name::parse` ([`NAME_FIELDS`], [`NAME_PARAMS`]): [`NAME_PATTERN`].
struct InputForms;

/// `(component, property)` pairs holding a name that the server checks with `Name::parse`.
const NAME_FIELDS: &[(&str, &str)] = &[
    ("CreateEnvironment", "name"),
    ("CreateService", "name"),
    ("CreateToken", "name"),
    ("CreateToken", "environment"),
    ("CreateUser", "username"),
];

/// Path parameters holding a name that the server checks with `Name::parse`, by the
/// operation's path and the parameter's name.
const NAME_PARAMS: &[(&str, &str)] = &[
    ("/api/v1/environments/{env}/services/{svc}/flags/{key}", "key"),
    ("/api/v1/environments/{env}/services/{svc}/faults/{id}", "id"),
    ("/api/v1/environments/{env}/profiles/{name}", "name"),
    ("/api/v1/users/{username}", "username"),
];

/// Tagged enums whose serde refuses unknown fields (`deny_unknown_fields`): internally tagged
/// ones of the policy model (`FaultAction`, `Window`) and externally tagged ones of an
/// experiment (`Probe`, `BlastRadius`, one key per value). utoipa leaves their variants, and
/// the bodies of struct variants, open to other properties; serde refuses them.
const CLOSED_TAGGED: &[&str] = &["FaultAction", "Window", "Probe", "BlastRadius"];

/// Closes an object schema to properties it does not name, and the inline object schemas of
/// its properties (a struct variant's body under its tag).
fn close(item: &mut RefOr<Schema>) {
    if let RefOr::T(Schema::Object(o)) = item {
        o.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(false)));
        for property in o.properties.values_mut() {
            if let RefOr::T(Schema::Object(body)) = property
                && !body.properties.is_empty()
            {
                body.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(false)));
            }
        }
    }
}

/// Request bodies whose `description` is checked by `check_text`.
const DESCRIBED: &[&str] = &["CreateEnvironment", "CreateService", "PutService", "PutProfile"];

fn text_schema(schema: &mut RefOr<Schema>, pattern: Option<&str>, min: Option<usize>, max: usize) {
    if let RefOr::T(Schema::Object(o)) = schema {
        o.pattern = pattern.map(str::to_string).or(o.pattern.take());
        o.min_length = min.or(o.min_length);
        o.max_length = Some(max);
    }
}

/// The components named by a request body: what a client sends (responses keep whatever
/// was stored, an empty reason of a login included).
fn request_components(openapi: &utoipa::openapi::OpenApi) -> Vec<String> {
    let mut out = Vec::new();
    for item in openapi.paths.paths.values() {
        let ops = [&item.get, &item.put, &item.post, &item.delete, &item.patch];
        for op in ops.into_iter().flatten() {
            let bodies = op.request_body.iter().filter_map(|b| match b {
                RefOr::T(b) => Some(b),
                RefOr::Ref(_) => None,
            });
            for content in bodies.flat_map(|b| b.content.values()) {
                if let RefOr::T(content) = content
                    && let Some(RefOr::Ref(r)) = &content.schema
                    && let Some(name) = r.ref_location.strip_prefix("#/components/schemas/")
                {
                    out.push(name.to_string());
                }
            }
        }
    }
    out
}

fn one_of_kinds(schema: &mut RefOr<Schema>) {
    let kinds = || Some(ChangeKind::ALL.iter().map(|k| serde_json::json!(k.as_str())).collect::<Vec<_>>());
    match schema {
        RefOr::T(Schema::Object(o)) => o.enum_values = kinds(),
        RefOr::T(Schema::Array(a)) => {
            if let utoipa::openapi::schema::ArrayItems::RefOrSchema(item) = &mut a.items
                && let RefOr::T(Schema::Object(o)) = item.as_mut()
            {
                o.enum_values = kinds();
            }
        }
        _ => {}
    }
}

impl Modify for InputForms {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let reason = |s: &mut RefOr<Schema>| text_schema(s, Some(REASON_PATTERN), Some(1), MAX_TEXT_CHARS);
        let requests = request_components(openapi);
        if let Some(components) = openapi.components.as_mut() {
            for name in CLOSED_TAGGED {
                if let Some(RefOr::T(Schema::OneOf(one_of))) = components.schemas.get_mut(*name) {
                    one_of.items.iter_mut().for_each(close);
                }
            }
            for (component, schema) in components.schemas.iter_mut() {
                if !requests.contains(component) {
                    continue;
                }
                let RefOr::T(Schema::Object(o)) = schema else { continue };
                for (field, property) in o.properties.iter_mut() {
                    match field.as_str() {
                        "reason" | "override_profile" => reason(property),
                        "kind" if component != "CreateToken" => one_of_kinds(property),
                        "kinds" => one_of_kinds(property),
                        "password" if component != "LoginRequest" => {
                            text_schema(property, None, Some(MIN_PASSWORD_CHARS), MAX_PASSWORD_CHARS);
                        }
                        "description" if DESCRIBED.contains(&component.as_str()) => {
                            text_schema(property, None, None, MAX_TEXT_CHARS);
                        }
                        _ if NAME_FIELDS.contains(&(component.as_str(), field.as_str())) => {
                            text_schema(property, Some(NAME_PATTERN), Some(1), 64);
                        }
                        "services" if component == "CreateToken" => {
                            if let RefOr::T(Schema::Array(a)) = property
                                && let utoipa::openapi::schema::ArrayItems::RefOrSchema(item) = &mut a.items
                            {
                                text_schema(item.as_mut(), Some(NAME_PATTERN), Some(1), 64);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        for (path, item) in openapi.paths.paths.iter_mut() {
            let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
            for op in ops.into_iter().flatten() {
                for param in op.parameters.iter_mut().flatten() {
                    let RefOr::T(param) = param else { continue };
                    let Some(schema) = param.schema.as_mut() else { continue };
                    match (&param.parameter_in, param.name.as_str()) {
                        (ParameterIn::Query, "reason") => {
                            reason(schema);
                            param.required = utoipa::openapi::Required::True;
                        }
                        (ParameterIn::Query, "override_profile") => reason(schema),
                        (ParameterIn::Header, name) if name.eq_ignore_ascii_case("if-match") => {
                            // A header is a string when sent: never `null`, even where optional.
                            if let RefOr::T(Schema::Object(o)) = schema {
                                o.schema_type = SchemaType::Type(Type::String);
                            }
                            text_schema(schema, Some(IF_MATCH_PATTERN), Some(1), 24);
                        }
                        (ParameterIn::Query, "limit") => {
                            if let RefOr::T(Schema::Object(o)) = schema {
                                o.minimum = Some(utoipa::Number::Int(1));
                                o.maximum = Some(utoipa::Number::Int(super::services::MAX_PAGE as isize));
                            }
                        }
                        (ParameterIn::Path, name) if NAME_PARAMS.contains(&(path.as_str(), name)) => {
                            text_schema(schema, Some(NAME_PATTERN), Some(1), 64);
                        }
                        _ => {}
                    }
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
        fleet::propagation, health::get,
        audit::list,
        tokens::create, tokens::list, tokens::revoke, tokens::rotate, tokens::list_users, tokens::create_user,
        services::put_service, services::delete_service, plan::plan,
        profiles::list, profiles::get_one, profiles::put, profiles::delete, profiles::apply,
        profiles::active, profiles::activations, profiles::revert,
        schedule::list, schedule::get_one, schedule::create, schedule::reschedule, schedule::cancel,
        requests::get_rules, requests::put_rules, requests::list, requests::get_one, requests::create,
        requests::edit, requests::approve, requests::reject, requests::apply,
        rollouts::get_settings, rollouts::put_settings, rollouts::list, rollouts::get_one, rollouts::promote,
        rollouts::pause, rollouts::resume, rollouts::abort,
        experiments::start, experiments::list, experiments::get_one, experiments::stop,
        tokens::update_user, document,
    ),
    modifiers(&BearerAuth, &ProblemResponses, &InputForms, &DurationDefaults),
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
