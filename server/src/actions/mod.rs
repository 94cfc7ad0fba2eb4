//! Every audited action: the writes that reach agents or the audit log.
//!
//! The API, the UI and the server's own tasks change nothing themselves. They parse what
//! they received into the typed input of an action (the form is checked there:
//! [`Name::parse`], [`Reason::parse`], the `New*::new` constructors), call the action on
//! [`Actions`] with the [`Actor`], and turn its result or its error into their answer. An
//! action
//!
//! 1. refuses unless the actor's role is at least [`Action::role`];
//! 2. checks what needs the stored state (does the environment allow faults, is the expiry
//!    in the future, does the flag exist and take this type);
//! 3. writes. A change to what agents receive is one new revision through
//!    [`Store::mutate`](crate::db::Store::mutate) — counter, changed rows, snapshot, hash
//!    and audit row in one transaction, a refused attempt audited too. Any other audited
//!    write stores its row and its audit row in one transaction;
//! 4. publishes a new revision to this replica's agent streams ([`Hub`]). This happens
//!    here and only here, so no caller can forget it; other replicas learn of it from the
//!    database (`listener`).
//!
//! # Adding an action
//! Add a variant to [`Action`] (its audit name and the role it needs), a typed input whose
//! constructor checks the form, and a method on [`Actions`] in the module of its resource.
//! A change to a service's configuration is an edit of its [`Parts`] passed to
//! `Actions::write`, which returns the [`AuditDiff`] of what it changed; everything after
//! (transaction, validation, audit, publishing) is shared.

mod access;
mod actor;
mod environments;
mod error;
mod experiments;
mod expiry;
mod faults;
pub(crate) mod flags;
mod game_day;
mod input;
mod overrides;
mod profiles;
mod requests;
mod restore;
mod rollouts;
mod schedule;
mod security;
mod service;

pub use crate::db::Via;
pub use access::{
    DEFAULT_ROTATION_OVERLAP, MAX_AGENT_TOKEN_SERVICES, MAX_ROTATION_OVERLAP_DAYS, MAX_TOKEN_TTL_DAYS,
    MIN_TOKEN_TTL, Minted, NewToken, NewUser, Rotated, Rotation, UserChange,
};
pub use actor::{Action, Actor, Forbidden};
pub use environments::NewEnvironment;
pub use error::{ChangeError, CreateError, Existing, Missing, TokenError};
pub use experiments::{NewExperiment, Started, experiment_fault_id};
pub use faults::NewFaultRule;
pub use game_day::{
    LEVER_ACTIONS, hide_injected, is_game_day, running_game_days, scheduled_as_seen, sees_injected,
};
pub use input::{
    BadInput, Broken, MAX_TEXT_CHARS, NAME_PATTERN, Name, REASON_BLANKS, REASON_PATTERN, Reason, ReasonError,
    check_text,
};
pub use overrides::NewOverride;
pub use profiles::{
    MAX_PROFILE_DURATION, Profile, ProfileBreaker, ProfileFault, ProfileService, ProfileSpec, ProfileUndo,
    Reverted, activation_services, profile_flag_keys, profile_undo,
};
pub use requests::{Approval, Proposal, config_kinds_changed, describe_request, request_sides};
pub use restore::RestoreError;
pub use rollouts::{Halted, InstanceView, RolloutDetail, SideView};
pub use schedule::{NewSchedule, Planned, SCHEDULE_LEASE, describe};
pub use security::{
    AUDIT_LOGIN, AUDIT_LOGIN_FAILED, AUDIT_LOGIN_THROTTLED, AUDIT_REFUSED, INVALID_USERNAME, LoginAttempt,
};
pub use service::{Declared, NewService};

use levee_agent::policy::{Lint, lint};

use crate::advice;

use crate::auth::Keys;
use crate::db::{
    AuditDiff, AuditOutcome, AuditRow, Change, Committed, Parts, SnapshotRow, Staging, Store, Subject, now_ms,
};
use crate::hub::Hub;

/// What every action is called on: the store, this replica's hub and the token keys.
/// Cheap to clone.
#[derive(Clone, Debug)]
pub struct Actions {
    store: Store,
    hub: Hub,
    keys: Keys,
    /// This run of the server, as it claims scheduled changes: the host name (when the
    /// environment gives one), the process id and a random suffix, unique per `Actions`.
    replica: std::sync::Arc<str>,
    /// The (game day, person) pairs whose first view this replica recorded already.
    game_day_seen: game_day::Seen,
}

/// The service a change is for, and the revision the change was based on.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceAt {
    pub env: String,
    pub service: String,
    /// The revision the caller read (the API's `If-Match`, the revision a UI page showed):
    /// the change is refused with a conflict unless the service is still at it. `None`
    /// applies the change to whatever is current.
    pub base: Option<u64>,
    /// Whether a policy change is staged (the environment's setting unless the request
    /// said).
    pub staging: Staging,
}

impl ServiceAt {
    /// `service` of `env`, as read at `base`.
    pub fn new(env: impl Into<String>, service: impl Into<String>, base: Option<u64>) -> ServiceAt {
        ServiceAt { env: env.into(), service: service.into(), base, staging: Staging::Default }
    }

    /// The same, with a policy change `staged` (`Some(true)`: as a rollout, with the
    /// environment's plan; `Some(false)`: at once) instead of as the environment's setting says.
    pub fn staged(self, staged: Option<bool>) -> ServiceAt {
        let staging = match staged {
            None => Staging::Default,
            Some(true) => Staging::Staged(None),
            Some(false) => Staging::Immediate,
        };
        ServiceAt { staging, ..self }
    }
}

/// A change to a service's configuration that went through.
#[derive(Clone, Debug)]
pub struct Written {
    /// The snapshot now current: the new revision, or the unchanged current one.
    pub snapshot: SnapshotRow,
    /// `false` when the change left the configuration as it was (no revision was made).
    pub changed: bool,
    /// The lints of the current policy.
    pub lints: Vec<Lint>,
    /// The staged rollout the change started, moved or ended, as it is now.
    pub rollout: Option<crate::db::RolloutRow>,
}

impl Actions {
    /// The actions over `store`, publishing to `hub`, minting tokens with `keys`.
    pub fn new(store: Store, hub: Hub, keys: Keys) -> Actions {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "levee".into());
        let run = uuid::Uuid::new_v4().simple().to_string();
        let replica = format!("{host}:{}:{}", std::process::id(), &run[..8]).into();
        Actions { store, hub, keys, replica, game_day_seen: game_day::Seen::default() }
    }

    /// This run of the server as it claims scheduled changes (see [`Actions::new`]).
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// Writes one revision of `at`'s service as `by`, for `reason`: `edit` changes the
    /// service's parts inside the transaction and returns what it changed; the new revision
    /// is published to this replica's agents. `target` names `subject` for the audit row (a
    /// refused attempt records the subject's stored value as `before` and `after`).
    #[allow(clippy::too_many_arguments)]
    async fn write<F>(
        &self,
        by: &Actor,
        reason: &Reason,
        action: Action,
        at: &ServiceAt,
        target: &str,
        subject: Subject,
        edit: F,
    ) -> Result<Written, ChangeError>
    where
        F: FnOnce(&mut Parts) -> Result<AuditDiff, ChangeError>,
    {
        by.may(action)?;
        let change = Change {
            env: &at.env,
            service: &at.service,
            action: action.name(),
            target,
            subject,
            expected: at.base,
            staging: at.staging.clone(),
        };
        // Four-eyes by what the write changes, whatever action carries it: the rules in
        // force now, against the parts this transaction replaces.
        let rules = self.four_eyes(by, &at.env).await?;
        let mut bypass = None;
        let edit = |p: &mut Parts| {
            let old = p.clone();
            let (flags, restores) = (p.flags.clone(), p.restores.clone());
            let diff = edit(p)?;
            bypass = rules.admit(&requests::kinds_changed(Some(&old), Some(p)))?;
            // Whatever the edit did to the flags, what their temporary values go back to
            // follows from it by one rule (`flags::remembered`). An edit may itself say what
            // a temporary flag goes back to (an apply over a flip: `flags::over_temporary`)
            // by changing its entry in `restores`; that wins over the memory from before.
            let mut memory = restores.clone();
            for (k, v) in std::mem::take(&mut p.restores) {
                if restores.get(&k) != Some(&v) {
                    memory.insert(k, v);
                }
            }
            p.restores = flags::remembered(&flags, &memory, &p.flags);
            Ok(diff)
        };
        let committed = self.store.mutate(change, &by.audit_ctx(reason), edit).await?;
        let bypass = bypass.filter(|_| committed.changed);
        let written = self.publish(committed).await;
        if let Some(b) = bypass {
            // The change is committed and published: a failure to audit it is logged, not
            // answered as if the change had not been made.
            let rev = Some(written.snapshot.revision);
            if let Err(e) = self.record_bypass(by, &at.env, Some(&at.service), target, &b, rev).await {
                tracing::error!(error = %e, environment = %at.env, service = %at.service, "auditing a break-glass change");
            }
        }
        Ok(written)
    }

    /// Publishes a new revision to this replica's agent streams (once, after commit), and
    /// says what the server advises about the policy now current, without the agents'
    /// reports ([`advice::for_write`]: the answer does not wait for a read of the fleet).
    async fn publish(&self, c: Committed) -> Written {
        if c.changed {
            // The rollout first: a stream woken by the new snapshot already sees which
            // instances it is for.
            if let Some((row, stable)) = c.rollout.clone() {
                self.hub.publish_rollout(row, stable);
            }
            self.hub.publish(c.snapshot.clone());
        }
        let lints = match c.snapshot.config() {
            Ok(cfg) => {
                let (env, svc) = (&c.snapshot.environment, &c.snapshot.service);
                advice::for_write(&self.store, env, svc, &cfg.policy).await.unwrap_or_else(|e| {
                    // Advice needs more reads; the write is done, so answer the policy's own lints.
                    tracing::warn!(error = %levee_agent::report::ErrorChain(e.as_ref()), "reading what advice needs");
                    lint(&cfg.policy)
                })
            }
            Err(_) => Vec::new(),
        };
        Written { snapshot: c.snapshot, changed: c.changed, lints, rollout: c.rollout.map(|(r, _)| r) }
    }
}

/// The audit row of an audited write that makes no revision: outcome `ok`, at this moment.
fn audit_row(by: &Actor, reason: &Reason, action: Action, target: String) -> AuditRow {
    AuditRow {
        at: now_ms(),
        actor: by.name.clone(),
        via: by.via,
        request_id: by.request_id.clone(),
        action: action.name().to_string(),
        target,
        outcome: AuditOutcome::Ok,
        reason: reason.as_str().to_string(),
        ..Default::default()
    }
}
