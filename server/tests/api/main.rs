//! API integration tests: a real server on port 0, real HTTP, a fresh database per test.

#[path = "../shared/backends.rs"]
#[allow(dead_code, unused_macros)]
#[macro_use]
mod backends;
mod accept;
mod apply;
mod audit_values;
mod auth;
mod auth_matrix;
mod errors;
mod experiment_approval;
mod four_eyes;
mod helpers;
mod history;
mod kill_switch_refs;
mod ofrep;
mod openapi_routes;
mod policy;
mod profile_undo;
mod profiles;
mod requests;
mod router;
mod schedule;
mod temporary_flips;
mod times;
