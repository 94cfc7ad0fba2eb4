//! Tests of the admission engine: the request path and its levers (`engine`), the queue
//! under a paused clock (`queue`), shadow mode (`shadow`), permits never leaked (`leaks`),
//! recovery after overload (`in_3`), no lockout of an idle service (`in_4`), no drift of an
//! adaptive limit under a sustained overload (`in_5`), no route table filled by clients
//! (`in_7`), protection by the default policy (`in_8`) and the tower layer (`layer`).
//! Client-side throttling is tested with its code, in `retry`. IN-1 and IN-2 run on real
//! HTTP in `agent/tests/agent`.

mod engine;
mod health;
mod in_3;
mod in_4;
mod in_5;
mod in_7;
mod in_8;
mod layer;
mod leaks;
mod queue;
mod shadow;

use std::time::Duration;

use super::*;
use crate::policy::{self, Criticality};

pub(super) const MS: Duration = Duration::from_millis(1);

/// Inbound settings from JSON (absent fields take their defaults).
pub(super) fn inbound(json: &str) -> policy::Inbound {
    let i: policy::Inbound = serde_json::from_str(json).expect("valid inbound settings");
    let p = policy::Policy { inbound: i.clone(), ..Default::default() };
    p.validate().expect("test settings validate");
    i
}

/// A standalone engine with seeded draws.
pub(super) fn engine(json: &str) -> Admission {
    Admission::with_seed(&inbound(json), 42)
}

pub(super) fn req(route: &str, c: Criticality) -> AdmissionRequest<'_> {
    AdmissionRequest::new(route).criticality(c)
}

/// Lets the queue task run until it has nothing left to do (current-thread runtime).
pub(super) async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}
