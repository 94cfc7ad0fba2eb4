//! Why an action was not taken. Each family of actions has its own error type; none knows
//! how it is answered (the API and the UI each map them).

use levee_agent::policy::{FieldError, ValidationErrors};

use super::{Forbidden, ProfileUndo};
use crate::db::{MutateError, Unreadable};

/// What an action refers to that does not exist.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Missing {
    /// The environment of the service, or the one a request names.
    #[error("no environment {env:?}")]
    Environment { env: String },
    /// A service of an environment.
    #[error("no service {service:?} in environment {env:?}")]
    Service { env: String, service: String },
    /// A stored revision of a service.
    #[error("no revision {revision} of service {service:?} in {env:?}")]
    Revision { env: String, service: String, revision: u64 },
    /// A flag of a service.
    #[error("no flag {key:?} in service {service:?}")]
    Flag { service: String, key: String },
    /// An override of a breaker of the dependency (any operation).
    #[error("no override on breaker {dependency:?}")]
    BreakerOverride {
        /// The dependency whose breaker it would force.
        dependency: String,
    },
    /// A fault-injection rule.
    #[error("no fault rule {id:?}")]
    FaultRule { id: String },
    /// A minted token (API or agent).
    #[error("no token {id:?}")]
    Token {
        /// Its id (the JWT's `jti`).
        id: String,
    },
    /// A user.
    #[error("no user {name:?}")]
    User {
        /// The username asked for.
        name: String,
    },
    /// An emergency profile of an environment.
    #[error("no profile {name:?} in environment {env:?}")]
    Profile { env: String, name: String },
    /// A change request that is not in a state for this step.
    #[error("no change request {id} in a state for this (open, or approved to apply)")]
    ChangeRequest { id: i64 },
    /// A pending scheduled change.
    #[error("no pending scheduled change {id}")]
    ScheduledChange { id: i64 },
    /// A staged rollout of an environment.
    #[error("no rollout {id} in environment {env:?}")]
    Rollout { env: String, id: i64 },
    /// An active emergency profile in an environment.
    #[error("no profile is active in environment {env:?}")]
    ActiveProfile { env: String },
    /// An experiment still running (for a stop: nobody asked it to stop yet).
    #[error("no running experiment {id} (it ended, or was asked to stop already)")]
    Experiment { id: i64 },
}

/// What a create action found already there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Existing {
    /// An environment of that name.
    #[error("environment {name:?} already exists")]
    Environment { name: String },
    /// A service of that name in the environment.
    #[error("service {name:?} already exists in {env:?}")]
    Service { env: String, name: String },
    /// A user of that name.
    #[error("user {name:?} already exists")]
    User { name: String },
}

/// Why a change to a service's configuration (a new revision) was not made.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// The actor's role does not allow the action.
    #[error(transparent)]
    Forbidden(#[from] Forbidden),
    /// The service, or what the change refers to inside it, does not exist.
    #[error(transparent)]
    NotFound(Missing),
    /// The service is no longer at the revision the change was based on.
    #[error(
        "revision conflict: the change was based on revision {expected}, the current revision is {current}"
    )]
    Conflict {
        /// The revision the change was based on.
        expected: u64,
        /// The current revision.
        current: u64,
    },
    /// The document given, or the configuration the change would make, does not validate;
    /// every bad field, with its path.
    #[error("{0}")]
    Invalid(ValidationErrors),
    /// One value the change refuses (a type mismatch, an expiry in the past).
    #[error("invalid value: {0}")]
    InvalidField(FieldError),
    /// A fault rule in an environment that does not allow fault injection.
    #[error("environment {env:?} does not allow fault injection (allow_faults is false)")]
    FaultsNotAllowed { env: String },
    /// The kind of change needs an approved change request in the environment.
    #[error(
        "{kind} changes in environment {env:?} need an approved change request (POST \
         /api/v1/environments/{env}/change-requests), or break-glass with a reason"
    )]
    ApprovalRequired { env: String, kind: crate::db::ChangeKind },
    /// An approved change request the approval no longer covers: its target changed since
    /// it was proposed (a flag, a policy, or the definition of the profile it applies), or
    /// its approver can no longer approve it. The request ends as `conflict`.
    #[error("change request {id} ({what}) was not applied: {why}; propose the change again")]
    ApprovalVoid {
        id: i64,
        what: String,
        /// Why, as the request's `outcome` says it.
        why: String,
    },
    /// Only the proposer edits a change request.
    #[error("only {proposer} (who proposed change request {id}) may edit it")]
    NotProposer { id: i64, proposer: String },
    /// The user or token that scheduled a change can no longer act (disabled, deleted,
    /// revoked, expired): the change is not applied when it comes due.
    #[error("its author can no longer make changes ({what}): not applied")]
    AuthorGone { what: String },
    /// The proposer of a change request cannot approve it.
    #[error("you proposed change request {id}: someone else must approve it")]
    SelfApproval { id: i64 },
    /// Another emergency profile is active in the environment: revert it first.
    #[error("profile {active:?} is active in environment {env:?}: revert it before applying another")]
    ProfileActive { env: String, active: String },
    /// A whole-service write or deletion would undo flags the emergency profile active in
    /// the environment set, and was not told to override it.
    #[error("{}", undo_message(.env, .undo))]
    ProfileWouldUndo {
        env: String,
        /// The profile and the flag paths the write would undo.
        undo: ProfileUndo,
    },
    /// A staged rollout of the service is in progress and the change would alter what it
    /// stages, or the rollout a step names is not in a state for it.
    #[error("{0}")]
    Rollout(String),
    /// A stored revision the change needs does not decode with this version.
    #[error(transparent)]
    Unreadable(#[from] Unreadable),
    /// The database failed; the cause is for the log only.
    #[error("storage failed")]
    Storage(#[source] anyhow::Error),
}

/// What [`ChangeError::ProfileWouldUndo`] says: what, whose, until when, and how to proceed.
fn undo_message(env: &str, u: &ProfileUndo) -> String {
    format!(
        "this write would undo {} set by emergency profile {} (applied by {}, active until {}) in environment \
         {env:?}; revert the profile first (POST /api/v1/environments/{env}/active-profile/revert), or send \
         override_profile with a reason to write anyway",
        u.undoes.join(", "),
        u.name,
        u.applied_by,
        levee_agent::policy::Timestamp::from_unix_ms(u.expires_at)
    )
}

impl From<anyhow::Error> for ChangeError {
    fn from(e: anyhow::Error) -> Self {
        ChangeError::Storage(e)
    }
}

impl From<MutateError<ChangeError>> for ChangeError {
    fn from(e: MutateError<ChangeError>) -> Self {
        match e {
            MutateError::NoEnvironment(env) => ChangeError::NotFound(Missing::Environment { env }),
            MutateError::NoService { env, service } => {
                ChangeError::NotFound(Missing::Service { env, service })
            }
            MutateError::Conflict { expected, current } => ChangeError::Conflict { expected, current },
            MutateError::Refused(e) => e,
            MutateError::Invalid(v) => ChangeError::Invalid(v),
            MutateError::Rollout(why) => ChangeError::Rollout(why),
            MutateError::Db(e) => ChangeError::Storage(e),
        }
    }
}

/// Why an environment, a service or a user was not created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The actor's role does not allow the action.
    #[error(transparent)]
    Forbidden(#[from] Forbidden),
    /// The environment of a new service does not exist.
    #[error(transparent)]
    NotFound(Missing),
    /// It exists already; nothing was changed.
    #[error(transparent)]
    AlreadyExists(Existing),
    /// The new service's configuration does not validate; every bad field, with its path.
    #[error("{0}")]
    Invalid(ValidationErrors),
    /// Refused as a change would be: what the new service sets needs an approved change
    /// request in its environment ([`ChangeError::ApprovalRequired`], or break-glass
    /// without a reason).
    #[error(transparent)]
    Refused(Box<ChangeError>),
    /// The database failed; the cause is for the log only.
    #[error("storage failed")]
    Storage(#[source] anyhow::Error),
}

impl From<ChangeError> for CreateError {
    fn from(e: ChangeError) -> Self {
        match e {
            ChangeError::Forbidden(f) => CreateError::Forbidden(f),
            ChangeError::Storage(e) => CreateError::Storage(e),
            e => CreateError::Refused(Box::new(e)),
        }
    }
}

impl From<anyhow::Error> for CreateError {
    fn from(e: anyhow::Error) -> Self {
        CreateError::Storage(e)
    }
}

/// Why a token was not minted or revoked.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The actor's role does not allow the action.
    #[error(transparent)]
    Forbidden(#[from] Forbidden),
    /// One value refused (an agent token for an environment that does not exist).
    #[error("invalid value: {0}")]
    InvalidField(FieldError),
    /// No token of that id.
    #[error(transparent)]
    NotFound(Missing),
    /// The token to rotate is revoked or expired.
    #[error(transparent)]
    Ended(crate::db::TokenEnded),
    /// The database or the signing key failed; the cause is for the log only.
    #[error("storage failed")]
    Storage(#[source] anyhow::Error),
}

impl From<anyhow::Error> for TokenError {
    fn from(e: anyhow::Error) -> Self {
        match e.downcast::<crate::db::TokenEnded>() {
            Ok(ended) => TokenError::Ended(ended),
            Err(e) => TokenError::Storage(e),
        }
    }
}
