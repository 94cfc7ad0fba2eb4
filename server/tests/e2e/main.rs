//! End-to-end tests: the real `levee` server (in-process, or the binary for kill tests),
//! real agents over gRPC, the real example service over HTTP.

#[path = "../shared/backends.rs"]
#[allow(dead_code, unused_macros)]
#[macro_use]
mod backends;
#[path = "../../../agent/examples/checkout/app.rs"]
mod checkout_app;
#[path = "../api/helpers.rs"]
#[allow(dead_code)]
mod helpers;
mod postgres_tls;
mod private_pg;
mod support;

mod admission;
mod advice;
mod backup;
mod bootstrap;
mod control_plane;
mod crash;
mod db_outage;
mod delivery;
mod experiments;
mod game_day;
mod haproxy;
mod health;
mod http_fallback;
mod kill_switch;
mod kubernetes;
mod leases;
mod logs;
mod metrics;
mod ofrep;
mod profiles;
mod resilience;
mod rollout;
mod security;
mod shutdown;
mod sync_runtime;
mod tls;
mod token_rotation;
mod xds;
