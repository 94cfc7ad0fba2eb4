//! Web UI tests: a real server on port 0, real HTTP, a fresh database per test. Plain HTTP
//! stands in for the browser (forms, cookies, redirects); no JavaScript is involved.

#[path = "../shared/backends.rs"]
#[allow(dead_code, unused_macros)]
#[macro_use]
mod backends;
mod admission;
mod approval;
mod browser;
mod changes;
#[path = "../../../agent/examples/checkout/app.rs"]
mod checkout_app;
mod experiments;
mod health;
mod helpers;
mod live;
mod login;
mod pages;
mod profiles;
mod review;
mod security;
// The e2e tests' real agents, example service and traffic, for the browser's game day.
#[path = "../e2e/support.rs"]
#[allow(dead_code)]
mod support;
mod unreadable;
