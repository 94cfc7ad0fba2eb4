//! Row types of the store and their decoding from `AnyRow`.

use anyhow::anyhow;
use levee_agent::policy::ServiceConfig;
use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::now_ms;

/// Role of a user or API token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads everything.
    Viewer,
    /// Flips switches, edits policies, applies profiles and faults.
    Operator,
    /// Manages users, tokens and environments too.
    Admin,
}

impl Role {
    /// Lower-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// Parses a lower-case name.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

/// Kind of a minted token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    /// For automation against the HTTP API, with a role.
    Api,
    /// For an agent's sync stream, scoped to an environment and services.
    Agent,
    /// For flag evaluation over OFREP (read-only), scoped to an environment and services:
    /// it reads the flags of those services and nothing else.
    Flags,
}

impl TokenKind {
    /// Lower-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            TokenKind::Api => "api",
            TokenKind::Agent => "agent",
            TokenKind::Flags => "flags",
        }
    }
}

/// A user who can log in (UI, or a session token from `POST /api/v1/auth/login`).
#[derive(Clone, Debug)]
pub struct UserRow {
    /// Row id, assigned by the database.
    pub id: i64,
    /// Login name, unique.
    pub username: String,
    /// argon2 PHC string.
    pub password_hash: String,
    /// What the user may do; read on every request, so a change applies at once.
    pub role: Role,
    /// Disabled users cannot log in.
    pub disabled: bool,
    /// Creation time, ms since the epoch.
    pub created_at: i64,
    /// Bumped by every password or role change; sessions opened at another epoch are ended.
    pub session_epoch: i64,
}

impl UserRow {
    pub(crate) fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        let role: String = r.try_get("role")?;
        Ok(UserRow {
            id: r.try_get("id")?,
            username: r.try_get("username")?,
            password_hash: r.try_get("password_hash")?,
            role: Role::parse(&role).ok_or_else(|| anyhow!("unknown role {role:?} in users"))?,
            disabled: r.try_get::<i64, _>("disabled")? != 0,
            created_at: r.try_get("created_at")?,
            session_epoch: r.try_get("session_epoch")?,
        })
    }
}

/// A minted token (the JWT itself is never stored).
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct TokenRow {
    /// Token id, the JWT's `jti`.
    pub id: String,
    /// API, agent or flags.
    pub kind: TokenKind,
    /// A name for people, e.g. `checkout-prod`; an API token acts as `token:<name>` in the audit log.
    pub name: String,
    /// Role of an API token.
    pub role: Option<Role>,
    /// Environment of an agent or flags token.
    pub environment: Option<String>,
    /// Services of an agent or flags token.
    pub services: Vec<String>,
    /// Who minted it.
    pub created_by: String,
    /// Minted at (RFC 3339; stored as ms since the epoch).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: i64,
    /// Expires at.
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub expires_at: i64,
    /// Revoked at; `null` while valid. A time in the future is the end of a rotation's
    /// overlap: the token works until then (and its streams end then).
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub revoked_at: Option<i64>,
    /// The person an API token acts for: the user who minted it, or the person behind the
    /// token that did. Nobody approves a change request they proposed through any session
    /// or token of theirs. `null` for tokens minted before it was recorded (their
    /// `created_by` stands in).
    pub person: Option<String>,
}

/// Whether a token whose `revoked_at` is this is revoked at `now` (ms since the epoch): a
/// time in the future is the end of a rotation's overlap, when it starts to count.
pub fn revoked(revoked_at: Option<i64>, now: i64) -> bool {
    revoked_at.is_some_and(|at| at <= now)
}

impl TokenRow {
    /// The person this token acts for ([`TokenRow::person`], else its `created_by`).
    pub fn person(&self) -> String {
        self.person.clone().unwrap_or_else(|| self.created_by.clone())
    }

    /// Whether the token is revoked at `now` (ms since the epoch): the one rule every door
    /// (API, agent stream, HTTP fallback, OFREP, the verified-token memory) applies, so a
    /// revocation scheduled by a rotation takes effect everywhere at the same instant.
    pub fn revoked(&self, now: i64) -> bool {
        revoked(self.revoked_at, now)
    }

    /// When the token stops working: its expiry, or its scheduled revocation if sooner.
    pub fn ends_at(&self) -> i64 {
        self.revoked_at.map_or(self.expires_at, |at| at.min(self.expires_at))
    }

    pub(crate) fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        let kind: String = r.try_get("kind")?;
        let role: Option<String> = r.try_get("role")?;
        let services: String = r.try_get("services")?;
        Ok(TokenRow {
            id: r.try_get("id")?,
            kind: match kind.as_str() {
                "api" => TokenKind::Api,
                "agent" => TokenKind::Agent,
                "flags" => TokenKind::Flags,
                other => return Err(anyhow!("unknown token kind {other:?}")),
            },
            name: r.try_get("name")?,
            role: role.as_deref().and_then(Role::parse),
            environment: r.try_get("environment")?,
            services: serde_json::from_str(&services)?,
            created_by: r.try_get("created_by")?,
            created_at: r.try_get("created_at")?,
            expires_at: r.try_get("expires_at")?,
            revoked_at: r.try_get("revoked_at")?,
            person: r.try_get("person")?,
        })
    }
}

/// An environment: services with their own policies and flags (`prod`, `staging`).
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct EnvironmentRow {
    /// Unique name.
    pub name: String,
    /// Free text for people.
    pub description: String,
    /// Whether fault injection is permitted here.
    pub allow_faults: bool,
    /// Creation time (RFC 3339).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: i64,
}

impl EnvironmentRow {
    pub(crate) fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        Ok(EnvironmentRow {
            name: r.try_get("name")?,
            description: r.try_get("description")?,
            allow_faults: r.try_get::<i64, _>("allow_faults")? != 0,
            created_at: r.try_get("created_at")?,
        })
    }
}

/// A service and its current revision.
#[derive(Clone, Debug)]
pub struct ServiceRow {
    pub environment: String,
    pub name: String,
    /// Free text given at creation.
    pub description: String,
    /// Current revision (the counter row).
    pub revision: u64,
    /// The current policy as JSON (the snapshot holds it too, with flags, faults and overrides).
    pub policy: String,
    /// Creation time, ms since the epoch.
    pub created_at: i64,
    /// Time of the last revision, ms since the epoch.
    pub updated_at: i64,
}

impl ServiceRow {
    pub(crate) fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        let rev: i64 = r.try_get("revision")?;
        Ok(ServiceRow {
            environment: r.try_get("environment")?,
            name: r.try_get("name")?,
            description: r.try_get("description")?,
            revision: rev as u64,
            policy: r.try_get("policy")?,
            created_at: r.try_get("created_at")?,
            updated_at: r.try_get("updated_at")?,
        })
    }
}

/// A stored snapshot.
#[derive(Clone, Debug)]
pub struct SnapshotRow {
    pub environment: String,
    pub service: String,
    pub revision: u64,
    /// SHA-256 hex of `body`.
    pub hash: String,
    /// Canonical JSON of the `ServiceConfig`.
    pub body: String,
    /// When this revision was written, ms since the epoch.
    pub created_at: i64,
}

/// A stored revision this server cannot read: its body does not decode as this version's
/// configuration (written by another version, or by hand). Pages and endpoints show it as
/// such — never a 500 — and a rollback to a revision that reads replaces it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("revision {revision} of {environment}/{service} cannot be read by this server: {reason}")]
pub struct Unreadable {
    pub environment: String,
    pub service: String,
    pub revision: u64,
    /// Where and why decoding stopped.
    pub reason: String,
}

impl SnapshotRow {
    /// The configuration this revision holds.
    ///
    /// # Errors
    /// [`Unreadable`] when the body does not decode (with the path where it stopped).
    pub fn config(&self) -> Result<ServiceConfig, Unreadable> {
        levee_agent::policy::decode_json::<ServiceConfig>(self.body.as_bytes()).map_err(|e| Unreadable {
            environment: self.environment.clone(),
            service: self.service.clone(),
            revision: self.revision,
            reason: e.to_string(),
        })
    }

    /// [`SnapshotRow::config`] as a JSON value (what diffs compare).
    ///
    /// # Errors
    /// As [`SnapshotRow::config`].
    pub fn value(&self) -> Result<serde_json::Value, Unreadable> {
        self.config().map(|c| serde_json::to_value(c).unwrap_or(serde_json::Value::Null))
    }

    pub(crate) fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        let rev: i64 = r.try_get("revision")?;
        Ok(SnapshotRow {
            environment: r.try_get("environment")?,
            service: r.try_get("service")?,
            revision: rev as u64,
            hash: r.try_get("hash")?,
            body: r.try_get("body")?,
            created_at: r.try_get("created_at")?,
        })
    }
}

/// One entry of a service's history.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct RevisionMeta {
    pub revision: u64,
    /// SHA-256 hex of the snapshot body.
    pub hash: String,
    /// Created at (RFC 3339).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: i64,
    /// Who made the change.
    pub actor: String,
    /// The reason given with the change, as in the audit log.
    pub reason: String,
}

impl RevisionMeta {
    pub(crate) fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        let rev: i64 = r.try_get("revision")?;
        Ok(RevisionMeta {
            revision: rev as u64,
            hash: r.try_get("hash")?,
            created_at: r.try_get("created_at")?,
            actor: r.try_get("actor")?,
            reason: r.try_get("reason")?,
        })
    }
}

stored_words! {
    /// Through which door a change came; recorded as the audit row's `via`.
    pub enum Via in "audit.via" {
        /// The HTTP API with a bearer token.
        Api => "api",
        /// The HTTP API from the `levee` command line (it sends `x-levee-client: cli`).
        Cli => "cli",
        /// The web UI (session cookie and a confirmed form).
        Ui => "ui",
        /// The server itself (the expiry sweeper, the bootstrap admin at start).
        #[default]
        Server => "server",
        /// A command run where the database is reachable, without the API (`levee users set`).
        Local => "local",
    }
}

stored_words! {
    /// What came of an audited attempt.
    pub enum AuditOutcome in "audit.outcome" {
        /// Done: the change was made, the login succeeded, the scheduled change applied.
        #[default]
        Ok => "ok",
        /// Refused: invalid, refused by the change itself, or held for approval.
        Rejected => "rejected",
        /// Not made: its target had moved past what it was based on.
        Conflict => "conflict",
        /// Made past the environment's approval rules by break-glass (`approval.bypass`).
        Bypass => "bypass",
        /// Refused for a lack of role.
        Forbidden => "forbidden",
        /// A login with wrong credentials, or a scheduled change that could not apply.
        Failed => "failed",
        /// A failed login that made further logins wait.
        Throttled => "throttled",
    }
}

/// One audit entry.
#[derive(Clone, Debug, Default, Serialize, utoipa::ToSchema)]
pub struct AuditRow {
    /// Sequence number (0 before insertion).
    pub id: i64,
    /// When (RFC 3339; stored as ms since the epoch).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub at: i64,
    /// Who (username, `token:<name>`, or `levee` for the server itself).
    pub actor: String,
    /// From where: `api`, `ui`, `cli`, `server` or `local`.
    pub via: Via,
    /// The request's `x-request-id`; empty for the server's own changes.
    pub request_id: String,
    /// What was attempted, e.g. `policy.update`, `flag.set`.
    pub action: String,
    /// Environment of the change; absent for tokens and users.
    pub environment: Option<String>,
    /// Service of the change; absent outside a service.
    pub service: Option<String>,
    /// Target inside the service (flag key, dependency…).
    pub target: String,
    /// What came of it.
    pub outcome: AuditOutcome,
    /// Mandatory reason given by the actor.
    pub reason: String,
    /// The JSON value of the target before the attempt (stored as JSON text; the API
    /// answers the JSON value itself): the flag, fault rule, breaker override, policy,
    /// profile entries… as they were; `null` when the target did not exist. Never a message:
    /// why an attempt was refused is in `detail`.
    #[serde(serialize_with = "json_text")]
    #[schema(value_type = Option<Value>)]
    pub before: Option<String>,
    /// The JSON value of the target after the attempt (like `before`); `null` when it no
    /// longer exists. A refused or conflicting attempt changed nothing: `after` equals
    /// `before`.
    #[serde(serialize_with = "json_text")]
    #[schema(value_type = Option<Value>)]
    pub after: Option<String>,
    /// What happened, in words, when there is more to say than the outcome: why an attempt
    /// was refused (`rejected`, `conflict`, `forbidden`), what a profile revert restored or
    /// left as it was, what a scheduled run did. Absent otherwise.
    pub detail: Option<String>,
    /// Revision created by the change.
    pub revision: Option<i64>,
}

impl AuditRow {
    pub(crate) fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        Ok(AuditRow {
            id: r.try_get("id")?,
            at: r.try_get("at")?,
            actor: r.try_get("actor")?,
            via: Via::parse(r.try_get("via")?)?,
            request_id: r.try_get("request_id")?,
            action: r.try_get("action")?,
            environment: r.try_get("environment")?,
            service: r.try_get("service")?,
            target: r.try_get("target")?,
            outcome: AuditOutcome::parse(r.try_get("outcome")?)?,
            reason: r.try_get("reason")?,
            before: r.try_get("before")?,
            after: r.try_get("after")?,
            detail: r.try_get("detail")?,
            revision: r.try_get("revision")?,
        })
    }
}

/// Writes audit JSON text as the JSON value it holds (text that is not JSON, which no
/// writer stores, stays a string rather than failing the whole answer).
fn json_text<S: serde::Serializer>(text: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match text.as_deref().map(serde_json::from_str::<serde_json::Value>) {
        None => s.serialize_none(),
        Some(Ok(v)) => v.serialize(s),
        Some(Err(_)) => text.serialize(s),
    }
}

/// Filter of the audit query; every field optional.
#[derive(Clone, Debug, Default)]
pub struct AuditFilter {
    /// Only rows of this environment.
    pub environment: Option<String>,
    /// Only rows of this service.
    pub service: Option<String>,
    /// Only rows by this actor.
    pub actor: Option<String>,
    /// Only rows at or after this time, ms since the epoch.
    pub since: Option<i64>,
    /// Only rows at or before this time, ms since the epoch.
    pub until: Option<i64>,
    /// Page: rows with a smaller id.
    pub before_id: Option<i64>,
    /// Most rows returned.
    pub limit: i64,
    /// Only rows of this action (`flag.set`) or family of actions (`flag`: `flag.set`,
    /// `flag.delete`).
    pub action: Option<String>,
    /// Leave out rows whose action matches this SQL `LIKE` pattern (`auth.%`: the logins).
    pub exclude_action: Option<String>,
}

/// The `source` of an agent whose stream is closed: the server no longer knows where its
/// configuration comes from, so it never shows `live`.
pub const DISCONNECTED_SOURCE: &str = "disconnected";

/// Live state of one agent instance for one service.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct AgentRow {
    pub environment: String,
    pub service: String,
    /// Instance id the agent sent.
    pub instance_id: String,
    /// `levee-agent` version the instance reported.
    pub agent_version: String,
    /// Whether a stream is open now: the replica holding it renews its lease; a stream
    /// whose lease ran out (its replica was killed) is not connected.
    pub connected: bool,
    /// When the stream opened (RFC 3339).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub connected_at: i64,
    /// Last message on the stream (RFC 3339).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub last_seen: i64,
    /// Revision the agent acknowledged (the same as `status.applied_revision`).
    pub applied_revision: u64,
    /// Hash of that revision.
    pub applied_hash: String,
    /// Where its configuration comes from: `live`, `cache`, `default`; `disconnected` when
    /// its stream is closed; empty until it said (the same as `status.source`).
    pub source: String,
    /// Last status report (JSON).
    #[schema(value_type = Option<Value>)]
    pub status: Option<serde_json::Value>,
}

impl AgentRow {
    pub(crate) fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        let rev: i64 = r.try_get("applied_revision")?;
        let status: Option<String> = r.try_get("status")?;
        let status: Option<serde_json::Value> = status.and_then(|s| serde_json::from_str(&s).ok());
        // Connected only while the holding replica's lease runs.
        let connected =
            r.try_get::<i64, _>("connected")? != 0 && r.try_get::<i64, _>("lease_until")? > now_ms();
        let source = match &status {
            _ if !connected => DISCONNECTED_SOURCE.to_string(),
            Some(v) => v["source"].as_str().unwrap_or("").to_string(),
            None => String::new(),
        };
        Ok(AgentRow {
            environment: r.try_get("environment")?,
            service: r.try_get("service")?,
            instance_id: r.try_get("instance_id")?,
            agent_version: r.try_get("agent_version")?,
            connected,
            connected_at: r.try_get("connected_at")?,
            last_seen: r.try_get("last_seen")?,
            applied_revision: rev as u64,
            applied_hash: r.try_get("applied_hash")?,
            source,
            status,
        })
    }
}

/// A NACK of a revision by an agent instance.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct NackRow {
    pub environment: String,
    pub service: String,
    /// Instance id the agent sent.
    pub instance_id: String,
    /// Rejected revision.
    pub revision: u64,
    /// Why the agent rejected it.
    pub error_detail: String,
    /// When the NACK arrived (RFC 3339).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub at: i64,
}

impl NackRow {
    pub(crate) fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        let rev: i64 = r.try_get("revision")?;
        Ok(NackRow {
            environment: r.try_get("environment")?,
            service: r.try_get("service")?,
            instance_id: r.try_get("instance_id")?,
            revision: rev as u64,
            error_detail: r.try_get("error_detail")?,
            at: r.try_get("at")?,
        })
    }
}

/// A change of fleet state to persist.
#[derive(Clone, Debug)]
pub enum FleetEvent {
    /// Insert or update an agent row.
    Upsert(AgentUpsert),
    /// Record a NACK.
    Nack(NackRow),
    /// Record when an instance acknowledged a revision pushed to it (the first ACK counts).
    Ack(AckRow),
}

/// An instance's first ACK of a revision.
#[derive(Clone, Debug)]
pub struct AckRow {
    pub environment: String,
    pub service: String,
    pub revision: u64,
    pub instance_id: String,
    /// When the ACK arrived, ms since the epoch.
    pub acked_at: i64,
}

/// How far a revision has reached: per agent, the time from its commit to the agent's ACK.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Propagation {
    pub environment: String,
    pub service: String,
    pub revision: u64,
    /// When the revision was committed (RFC 3339).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub committed_at: i64,
    /// Connected agents that applied this revision or a later one ("N").
    pub applied: usize,
    /// Connected agents ("M").
    pub connected: usize,
    /// Agents that ACKed this very revision (pushed to them).
    pub acked: usize,
    /// Median commit-to-ACK time over the agents that ACKed it (a duration, `"42ms"`);
    /// absent before the first ACK.
    #[serde(with = "levee_agent::policy::duration::option")]
    #[schema(value_type = Option<String>, example = "42ms")]
    pub p50: Option<std::time::Duration>,
    /// 99th percentile (nearest rank).
    #[serde(with = "levee_agent::policy::duration::option")]
    #[schema(value_type = Option<String>, example = "180ms")]
    pub p99: Option<std::time::Duration>,
    /// Slowest.
    #[serde(with = "levee_agent::policy::duration::option")]
    #[schema(value_type = Option<String>, example = "240ms")]
    pub max: Option<std::time::Duration>,
    /// The ACKs, fastest first: at most [`MAX_ACKS_LISTED`](super::MAX_ACKS_LISTED) of
    /// them (`acked` and the percentiles count every one).
    pub acks: Vec<AgentAck>,
}

/// One agent's ACK of a revision.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct AgentAck {
    pub instance_id: String,
    /// When its ACK arrived (RFC 3339).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub acked_at: i64,
    /// From commit to this ACK (a duration, `"42ms"`; millisecond resolution).
    #[serde(with = "levee_agent::policy::duration")]
    #[schema(value_type = String, example = "42ms")]
    pub latency: std::time::Duration,
}

/// The nearest-rank percentile `p` (0–100) of sorted `values`.
pub fn percentile(sorted: &[i64], p: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted.get(rank.min(sorted.len()) - 1).copied()
}

/// Fields of an agent row to write.
#[derive(Clone, Debug)]
pub struct AgentUpsert {
    pub environment: String,
    pub service: String,
    /// Instance id the agent sent.
    pub instance_id: String,
    /// `levee-agent` version the instance reported.
    pub agent_version: String,
    /// Whether its stream is open now.
    pub connected: bool,
    /// When the stream opened, ms since the epoch.
    pub connected_at: i64,
    /// Last message on the stream, ms since the epoch.
    pub last_seen: i64,
    /// Revision the instance acknowledged.
    pub applied_revision: u64,
    /// Hash of that revision.
    pub applied_hash: String,
    /// Last status report JSON (None keeps the stored one).
    pub status: Option<String>,
}
