//! Who acts, and which role each action needs.

use super::Reason;
use crate::auth::Principal;
use crate::db::{AuditCtx, Role, Via};

/// Who makes a change.
#[derive(Clone, Debug)]
pub struct Actor {
    /// Recorded in the audit log: a username, `token:<name>`, or `levee` for the server.
    pub name: String,
    /// Checked against [`Action::role`]; for a user it was read from the database on this
    /// request, so a demotion applies at once.
    pub role: Role,
    /// Recorded in the audit log.
    pub via: Via,
    /// The request's `x-request-id`, recorded in the audit log; empty outside a request.
    pub request_id: String,
    /// Whether this change applies an approved request or breaks the glass (four-eyes).
    pub approval: super::Approval,
    /// The user this actor is: a session of that user ([`Principal::user`]); `None` for an
    /// API token, the server (a scheduled change runs under its author's name, not as
    /// them) and a local admin. What "oneself" means, never compared by name.
    pub user: Option<String>,
    /// The person behind this actor: a session's user, the person an API token acts for
    /// (through any chain of tokens minted by tokens). `None` for the server and a local
    /// admin, who are who their name says. Four-eyes compares this, never names.
    pub person: Option<String>,
    /// The API token this actor uses (its id), so a change scheduled through it runs with
    /// the token's role at run time; `None` otherwise.
    pub token: Option<String>,
}

impl Actor {
    /// The authenticated caller of a request.
    pub fn new(principal: &Principal, via: Via, request_id: impl Into<String>) -> Actor {
        Actor {
            name: principal.actor.clone(),
            role: principal.role,
            via,
            request_id: request_id.into(),
            approval: super::Approval::None,
            user: principal.user.clone(),
            person: Some(principal.person.clone()),
            token: principal.token.clone(),
        }
    }

    /// The server acting on its own (recorded as `levee` via `server`): its upkeep
    /// (expiries), which no approval rule gates.
    pub fn server() -> Actor {
        Actor {
            name: "levee".into(),
            role: Role::Admin,
            via: Via::Server,
            request_id: String::new(),
            approval: super::Approval::Upkeep,
            user: None,
            person: None,
            token: None,
        }
    }

    /// Someone at the server's host with access to its database (`levee users set`),
    /// recorded as `name` (the operating-system user when known) via `local`.
    pub fn local(name: impl Into<String>) -> Actor {
        Actor {
            name: name.into(),
            role: Role::Admin,
            via: Via::Local,
            request_id: String::new(),
            approval: super::Approval::None,
            user: None,
            person: None,
            token: None,
        }
    }

    /// The person behind this actor ([`Actor::person`]), else its name.
    pub fn person(&self) -> String {
        self.person.clone().unwrap_or_else(|| self.name.clone())
    }

    /// Whether this actor is `person` (or, without a person, has that name): what
    /// "oneself" means for four-eyes.
    pub fn is(&self, person: &str) -> bool {
        self.person() == person
    }

    /// Refuses unless this actor's role is at least the one `action` needs.
    ///
    /// # Errors
    /// [`Forbidden`] naming both roles.
    pub fn may(&self, action: Action) -> Result<(), Forbidden> {
        Forbidden::check(self.role, action.role())
    }

    pub(super) fn audit_ctx(&self, reason: &Reason) -> AuditCtx {
        AuditCtx {
            actor: self.name.clone(),
            via: self.via,
            request_id: self.request_id.clone(),
            reason: reason.as_str().to_string(),
        }
    }
}

/// Every audited action. Adding one starts here: its name in the audit log and the role it
/// needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Creates an environment.
    EnvironmentCreate,
    /// Creates a service with its first revision.
    ServiceCreate,
    /// Replaces a service's policy.
    PolicyUpdate,
    /// Makes an older revision's content current again.
    Rollback,
    /// Creates or replaces a flag, or changes its value.
    FlagSet,
    /// Deletes a flag.
    FlagDelete,
    /// Forces a breaker's state.
    BreakerOverride,
    /// Removes a breaker override.
    BreakerOverrideDelete,
    /// Creates or replaces a fault-injection rule.
    FaultSet,
    /// Removes a fault-injection rule.
    FaultDelete,
    /// Removes expired flags, fault rules and breaker overrides (the server only).
    Expiry,
    /// Mints an API or agent token.
    TokenCreate,
    /// Revokes a token.
    TokenRevoke,
    /// Mints a token of another's scope and ends that one after an overlap.
    TokenRotate,
    /// Creates a user.
    UserCreate,
    /// Changes a user's password or role (ending the user's sessions).
    UserUpdate,
    /// Replaces what a service declares (policy, flags, description) as a manifest does.
    ServiceApply,
    /// Deletes a service (its history stays).
    ServiceDelete,
    /// Creates or replaces an emergency profile (a new version).
    ProfileSet,
    /// Deletes an emergency profile (its versions stay).
    ProfileDelete,
    /// Applies an emergency profile to its environment until an expiry.
    ProfileApply,
    /// Reverts the active emergency profile (by hand or at its expiry).
    ProfileRevert,
    /// Schedules a change (flag value, policy, profile application) for a time.
    ScheduleCreate,
    /// Moves a scheduled change to another time.
    ScheduleUpdate,
    /// Cancels a scheduled change.
    ScheduleCancel,
    /// A scheduled change that came due and was not applied (conflict, failure).
    ScheduleRun,
    /// Sets which kinds of change need an approved change request in an environment.
    ApprovalRules,
    /// A change applied without the approval its kind needs (break-glass).
    ApprovalBypass,
    /// Proposes a change for review.
    RequestCreate,
    /// Edits a proposed change (voids its approval).
    RequestUpdate,
    /// Approves a change proposed by someone else.
    RequestApprove,
    /// Rejects (or withdraws) a proposed change.
    RequestReject,
    /// Applies an approved change.
    RequestApply,
    /// Moves every service past its restored revision after `levee restore`.
    Restore,
    /// Sets which changes an environment stages and the plan they follow.
    RolloutSettings,
    /// Moves a staged rollout to its next stage (or completes it) before its bake time.
    RolloutPromote,
    /// Pauses a staged rollout.
    RolloutPause,
    /// Resumes a paused rollout.
    RolloutResume,
    /// Aborts a staged rollout: the previous policy back for every instance.
    RolloutAbort,
    /// The server halts a rollout whose cohort is worse than the rest (the server only).
    RolloutHalt,
    /// The server starts a rollout's next stage or completes it (the server only).
    RolloutStage,
    /// Starts an experiment (its fault is then set and removed as `fault.set` /
    /// `fault.delete` under the same actor).
    ExperimentStart,
    /// Asks a running experiment to stop (it aborts and removes its fault).
    ExperimentStop,
    /// An experiment ended with its verdict (recorded by the server).
    ExperimentEnd,
}

impl Action {
    /// The audit row's `action`, e.g. `flag.set`.
    pub const fn name(self) -> &'static str {
        match self {
            Action::EnvironmentCreate => "environment.create",
            Action::ServiceCreate => "service.create",
            Action::PolicyUpdate => "policy.update",
            Action::Rollback => "service.rollback",
            Action::FlagSet => "flag.set",
            Action::FlagDelete => "flag.delete",
            Action::BreakerOverride => "breaker.override",
            Action::BreakerOverrideDelete => "breaker.override.delete",
            Action::FaultSet => "fault.set",
            Action::FaultDelete => "fault.delete",
            Action::Expiry => "expiry",
            Action::TokenCreate => "token.create",
            Action::TokenRevoke => "token.revoke",
            Action::TokenRotate => "token.rotate",
            Action::UserCreate => "user.create",
            Action::UserUpdate => "user.update",
            Action::ServiceApply => "service.apply",
            Action::ServiceDelete => "service.delete",
            Action::ProfileSet => "profile.set",
            Action::ProfileDelete => "profile.delete",
            Action::ProfileApply => "profile.apply",
            Action::ProfileRevert => "profile.revert",
            Action::ScheduleCreate => "schedule.create",
            Action::ScheduleUpdate => "schedule.update",
            Action::ScheduleCancel => "schedule.cancel",
            Action::ScheduleRun => "schedule.run",
            Action::ApprovalRules => "approval.rules",
            Action::ApprovalBypass => "approval.bypass",
            Action::RequestCreate => "request.create",
            Action::RequestUpdate => "request.update",
            Action::RequestApprove => "request.approve",
            Action::RequestReject => "request.reject",
            Action::RequestApply => "request.apply",
            Action::Restore => "service.restore",
            Action::RolloutSettings => "rollout.settings",
            Action::RolloutPromote => "rollout.promote",
            Action::RolloutPause => "rollout.pause",
            Action::RolloutResume => "rollout.resume",
            Action::RolloutAbort => "rollout.abort",
            Action::RolloutHalt => "rollout.halt",
            Action::RolloutStage => "rollout.stage",
            Action::ExperimentStart => "experiment.start",
            Action::ExperimentStop => "experiment.stop",
            Action::ExperimentEnd => "experiment.end",
        }
    }

    /// The least role that may take this action: operators change services; admins
    /// manage environments, tokens and users.
    pub const fn role(self) -> Role {
        match self {
            Action::ServiceCreate
            | Action::PolicyUpdate
            | Action::Rollback
            | Action::FlagSet
            | Action::FlagDelete
            | Action::BreakerOverride
            | Action::BreakerOverrideDelete
            | Action::FaultSet
            | Action::FaultDelete
            | Action::ServiceApply
            | Action::ServiceDelete
            | Action::ProfileSet
            | Action::ProfileDelete
            | Action::ProfileApply
            | Action::ProfileRevert
            | Action::ScheduleCreate
            | Action::ScheduleUpdate
            | Action::ScheduleCancel
            | Action::ScheduleRun
            | Action::ApprovalBypass
            | Action::RequestCreate
            | Action::RequestUpdate
            | Action::RequestApprove
            | Action::RequestReject
            | Action::RequestApply
            | Action::RolloutPromote
            | Action::RolloutPause
            | Action::RolloutResume
            | Action::RolloutAbort
            | Action::ExperimentStart
            | Action::ExperimentStop
            | Action::ExperimentEnd => Role::Operator,
            Action::EnvironmentCreate
            | Action::Expiry
            | Action::TokenCreate
            | Action::TokenRevoke
            | Action::TokenRotate
            | Action::UserCreate
            | Action::UserUpdate
            | Action::ApprovalRules
            | Action::Restore
            | Action::RolloutSettings
            | Action::RolloutHalt
            | Action::RolloutStage => Role::Admin,
        }
    }
}

/// The actor's role is below the one needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this action needs the {} role; you are {}", needed.as_str(), actual.as_str())]
pub struct Forbidden {
    /// The least role allowed.
    pub needed: Role,
    /// The actor's role.
    pub actual: Role,
}

impl Forbidden {
    /// `Ok` when `actual` is at least `needed` (viewer < operator < admin).
    ///
    /// # Errors
    /// [`Forbidden`] otherwise.
    pub fn check(actual: Role, needed: Role) -> Result<(), Forbidden> {
        if actual >= needed { Ok(()) } else { Err(Forbidden { needed, actual }) }
    }
}
