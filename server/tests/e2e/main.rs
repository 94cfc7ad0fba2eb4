//! End-to-end tests: the real `levee` server (in-process, or the binary for kill tests),
//! real agents over gRPC, the real example service over HTTP.

#[path = "../../../agent/examples/checkout/app.rs"]
mod checkout_app;
#[path = "../api/helpers.rs"]
#[allow(dead_code)]
mod helpers;
mod support;

mod admission;
mod advice;
mod control_plane;
mod kill_switch;
mod logs;
mod resilience;
