use std::time::Duration;

use super::*;
use crate::policy::{FaultAction, FaultRule, Timestamp};
use crate::retry::{ErrorKind, FastRng};

fn rule(op: Option<&str>, action: FaultAction, percent: f64, expires_at: Timestamp) -> FaultRule {
    FaultRule {
        id: "r".into(),
        dependency: "pricing".into(),
        operation: op.map(Into::into),
        action,
        percent,
        expires_at,
        instances: Vec::new(),
    }
}

const NOW: Timestamp = Timestamp::from_unix_ms(1_800_000_000_000);

fn later() -> Timestamp {
    Timestamp::from_unix_ms(NOW.unix_ms() + 60_000)
}

#[test]
fn expired_rules_and_disallowed_environments_never_fire() {
    let rng = FastRng::with_seed(1);
    let abort = FaultAction::Abort { status: 503 };
    let expired = [rule(None, abort.clone(), 100.0, NOW)];
    for _ in 0..1000 {
        assert_eq!(decide(&expired, "pricing", "quote", true, NOW, &rng), FaultDecision::None);
    }
    let live = [rule(None, abort, 100.0, later())];
    assert_eq!(decide(&live, "pricing", "quote", false, NOW, &rng), FaultDecision::None);
    assert_eq!(decide(&live, "pricing", "quote", true, NOW, &rng), FaultDecision::Abort(503));
    assert_eq!(decide(&live, "search", "quote", true, NOW, &rng), FaultDecision::None);
}

#[test]
fn rules_are_scoped_to_operations_and_tried_in_order() {
    let rng = FastRng::with_seed(2);
    let rules = [
        rule(Some("quote"), FaultAction::Delay { delay: Duration::from_secs(2) }, 100.0, later()),
        rule(None, FaultAction::ConnectionError, 100.0, later()),
    ];
    assert_eq!(
        decide(&rules, "pricing", "quote", true, NOW, &rng),
        FaultDecision::Delay(Duration::from_secs(2))
    );
    assert_eq!(decide(&rules, "pricing", "list", true, NOW, &rng), FaultDecision::ConnectionError);
    assert_eq!(FaultDecision::ConnectionError.error_kind(), Some(ErrorKind::Connect));
    assert_eq!(FaultDecision::Abort(502).error_kind(), Some(ErrorKind::HttpStatus(502)));
    assert_eq!(FaultDecision::Delay(Duration::ZERO).error_kind(), None);
}

#[test]
fn percentage_is_respected() {
    let rng = FastRng::with_seed(3);
    let rules = [rule(None, FaultAction::Abort { status: 500 }, 30.0, later())];
    let fired = (0..20_000)
        .filter(|_| decide(&rules, "pricing", "x", true, NOW, &rng) != FaultDecision::None)
        .count();
    assert!((5_600..=6_400).contains(&fired), "{fired} of 20000 at 30 %");
    let never = [rule(None, FaultAction::Abort { status: 500 }, 0.0, later())];
    assert!((0..1000).all(|_| decide(&never, "pricing", "x", true, NOW, &rng) == FaultDecision::None));
}

#[test]
fn injector_applies_live_rules_only_when_allowed() {
    let inj = FaultInjector::new();
    let far = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + 3_600_000);
    let past = Timestamp::from_unix_ms(Timestamp::now().unix_ms() - 1);
    inj.update(vec![rule(None, FaultAction::Abort { status: 503 }, 100.0, far)], false);
    assert_eq!(inj.decide("pricing", "q"), FaultDecision::None);
    inj.update(vec![rule(None, FaultAction::Abort { status: 503 }, 100.0, far)], true);
    assert_eq!(inj.decide("pricing", "q"), FaultDecision::Abort(503));
    inj.update(vec![rule(None, FaultAction::Abort { status: 503 }, 100.0, past)], true);
    assert_eq!(inj.decide("pricing", "q"), FaultDecision::None);
}
