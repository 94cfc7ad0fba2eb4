//! API integration tests: a real server on port 0, real HTTP, a fresh database per test.

mod apply;
mod auth;
mod errors;
mod helpers;
mod history;
mod kill_switch_refs;
mod policy;
mod profiles;
mod requests;
mod router;
mod schedule;
mod times;
