//! Shadow mode on a recorded sequence: it rejects nothing, and counts exactly what
//! enforce mode rejects on the same sequence.

use std::time::Duration;

use super::*;
use crate::deadline::Deadline;
use crate::retry::FastRng;

/// One step of a recorded workload.
#[derive(Clone, Copy, Debug)]
enum Event {
    Arrive { id: usize, route: &'static str, criticality: Criticality, expired: bool },
    Finish { id: usize },
}

fn recorded(seed: u64, n: usize) -> Vec<Event> {
    let rng = FastRng::with_seed(seed);
    let mut events = Vec::new();
    let mut open = Vec::new();
    for id in 0..n {
        while !open.is_empty() && rng.below(3) == 0 {
            let i = rng.below(open.len() as u64) as usize;
            events.push(Event::Finish { id: open.swap_remove(i) });
        }
        let route = ["GET /a", "GET /b", "POST /c"][rng.below(3) as usize];
        let criticality = [
            Criticality::CriticalPlus,
            Criticality::Critical,
            Criticality::SheddablePlus,
            Criticality::Sheddable,
        ][rng.below(4) as usize];
        events.push(Event::Arrive { id, route, criticality, expired: rng.below(20) == 0 });
        open.push(id);
    }
    events
}

const SETTINGS: &str = r#"{"limit": {"algorithm": "fixed", "initial_limit": 3}, "queue": {"max_len": 0},
    "shed_sheddable_percent": 25}"#;

/// Replays `events`; returns how many requests were refused.
fn replay(a: &Admission, events: &[Event]) -> usize {
    let mut permits: Vec<Option<AdmissionPermit>> = Vec::new();
    let mut refused = 0;
    for e in events {
        match *e {
            Event::Arrive { id, route, criticality, expired } => {
                let deadline = Deadline::after(if expired { Duration::ZERO } else { Duration::from_secs(5) });
                let r =
                    a.try_admit(&AdmissionRequest::new(route).criticality(criticality).deadline(deadline));
                permits.resize_with(id + 1, || None);
                match r {
                    Ok(p) => permits[id] = Some(p),
                    Err(_) => refused += 1,
                }
            }
            Event::Finish { id } => permits[id] = None,
        }
    }
    refused
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_rejects_nothing_and_counts_exactly_what_enforce_mode_rejects() {
    let events = recorded(7, 3000);
    let enforce = Admission::with_seed(&inbound(SETTINGS), 99);
    let shadow_settings = inbound(&SETTINGS.replace("\"queue\"", "\"mode\": \"shadow\", \"queue\""));
    let shadow = Admission::with_seed(&shadow_settings, 99);

    let refused = replay(&enforce, &events);
    assert_eq!(replay(&shadow, &events), 0, "shadow mode rejected a request");

    let (e, s) = (enforce.status(), shadow.status());
    assert!(refused > 300, "the sequence must overload the limit: {refused} refused");
    for reason in [Reason::Limit, Reason::Operator, Reason::Deadline] {
        assert!(e.shed_total(reason, false) > 0, "{reason} never happened in the sequence");
    }
    assert_eq!(e.routes.len(), s.routes.len());
    for (er, sr) in e.routes.iter().zip(&s.routes) {
        assert_eq!(er.route, sr.route);
        assert_eq!(er.shed, sr.would_shed, "route {}", er.route);
        assert!(sr.shed.is_empty() && er.would_shed.is_empty());
    }
    let total: u64 = s.routes.iter().flat_map(|r| &r.would_shed).map(|c| c.count).sum();
    assert_eq!(total, refused as u64);
    assert_eq!((s.in_flight, e.in_flight), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_with_a_queue_admits_at_once_and_counts_would_queue() {
    let a = engine(r#"{"mode": "shadow", "limit": {"algorithm": "fixed", "initial_limit": 1}}"#);
    let _held = a.try_admit(&req("GET /x", Criticality::Critical)).unwrap();
    let p = a.admit(&req("GET /x", Criticality::Sheddable)).await.unwrap();
    assert!(!p.is_counted());
    let s = a.status();
    assert_eq!(s.routes.iter().find(|r| r.route == "GET /x").unwrap().would_queue, 1);
    assert_eq!(s.in_flight, 1);
}
