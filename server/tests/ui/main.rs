//! Web UI tests: a real server on port 0, real HTTP, a fresh database per test. Plain HTTP
//! stands in for the browser (forms, cookies, redirects); no JavaScript is involved.

mod admission;
mod changes;
mod helpers;
mod login;
mod pages;
mod security;
