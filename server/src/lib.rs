//! Levee server: stores resilience policies and kill switches per environment and service,
//! versions and audits every change, serves the API (and UI), and pushes snapshots to agents
//! over gRPC.

pub mod actions;
pub mod advice;
pub mod agent_text;
pub mod alerts;
pub mod api;
pub mod app;
pub mod auth;
pub mod cli;
pub mod config;
pub mod db;
pub mod diff;
pub mod experiments;
pub mod fleet;
pub mod fuzz;
pub mod health;
pub mod hub;
pub mod import;
pub mod listener;
pub mod login_limit;
pub mod manifest;
pub mod rollout;
pub mod runtime;
pub mod shutdown;
pub mod sidecar;
pub mod streams;
pub mod sweeper;
pub mod sync;
pub mod tls;
pub mod ui;
pub mod web;
pub mod xds;

pub use app::{Server, app};
pub use config::Settings;
