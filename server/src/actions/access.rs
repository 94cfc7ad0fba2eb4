//! Access: API and agent tokens, and users.

use std::time::Duration;

use super::{
    Action, Actions, Actor, BadInput, CreateError, Existing, Missing, Name, Reason, TokenError, audit_row,
};
use crate::auth::{TOKEN_TTL, check_password, hash_password};
use crate::db::{Role, TokenKind, TokenRow, now_ms};

/// Shortest lifetime of a minted token.
pub const MIN_TOKEN_TTL: Duration = Duration::from_secs(60);
/// Longest lifetime of a minted token, in days.
pub const MAX_TOKEN_TTL_DAYS: u64 = 3650;
/// Most services one agent token may read.
pub const MAX_AGENT_TOKEN_SERVICES: usize = 100;
/// Overlap of a rotation when none is given: how long the old token keeps working beside
/// the new one, for the new one to reach every instance.
pub const DEFAULT_ROTATION_OVERLAP: Duration = Duration::from_secs(3600);
/// Longest overlap of a rotation, in days.
pub const MAX_ROTATION_OVERLAP_DAYS: u64 = 30;

/// A rotation to make, checked for its form.
#[derive(Clone, Copy, Debug)]
pub struct Rotation {
    overlap: Duration,
    ttl: Option<Duration>,
}

impl Rotation {
    /// Checks `overlap` (default [`DEFAULT_ROTATION_OVERLAP`], from 0 — the old token ends
    /// now — to [`MAX_ROTATION_OVERLAP_DAYS`]) and `expires_in` (the new token's lifetime,
    /// in the range of a minted token; default: the old token's lifetime).
    ///
    /// # Errors
    /// [`BadInput`] naming the field.
    pub fn new(overlap: Option<Duration>, expires_in: Option<Duration>) -> Result<Rotation, BadInput> {
        let overlap = overlap.unwrap_or(DEFAULT_ROTATION_OVERLAP);
        if overlap > Duration::from_secs(MAX_ROTATION_OVERLAP_DAYS * 86400) {
            return Err(BadInput::rule(
                "overlap",
                levee_agent::policy::duration::format(overlap),
                format!("must be between 0s and {MAX_ROTATION_OVERLAP_DAYS}d"),
            ));
        }
        if let Some(ttl) = expires_in {
            check_ttl(ttl)?;
        }
        Ok(Rotation { overlap, ttl: expires_in })
    }
}

/// A rotation made: the new token and the old one as it is now (its `revoked_at` is the
/// end of the overlap).
#[derive(Clone, Debug)]
pub struct Rotated {
    /// The new token, of the old one's kind, name and scope.
    pub minted: Minted,
    /// The old token, ending at its `revoked_at`.
    pub replaced: TokenRow,
}

/// A minted token's lifetime within [`MIN_TOKEN_TTL`] and [`MAX_TOKEN_TTL_DAYS`].
fn check_ttl(ttl: Duration) -> Result<(), BadInput> {
    if ttl < MIN_TOKEN_TTL || ttl > Duration::from_secs(MAX_TOKEN_TTL_DAYS * 86400) {
        return Err(BadInput::rule(
            "expires_in",
            levee_agent::policy::duration::format(ttl),
            format!(
                "must be between {} and {MAX_TOKEN_TTL_DAYS}d",
                levee_agent::policy::duration::format(MIN_TOKEN_TTL)
            ),
        ));
    }
    Ok(())
}

/// A token to mint, checked for its form.
#[derive(Clone, Debug)]
pub struct NewToken {
    kind: TokenKind,
    name: Name,
    role: Option<Role>,
    environment: Option<Name>,
    services: Vec<Name>,
    ttl: Duration,
}

impl NewToken {
    /// Checks the form of a token request, field by field in this order: `name`;
    /// `expires_in` (default [`TOKEN_TTL`], from [`MIN_TOKEN_TTL`] to
    /// [`MAX_TOKEN_TTL_DAYS`]); for an agent token an `environment`, 1 to
    /// [`MAX_AGENT_TOKEN_SERVICES`] `services` and no `role`; for an API token no
    /// environment nor services (its `role` defaults to viewer).
    ///
    /// # Errors
    /// [`BadInput`] naming the first bad field.
    pub fn new(
        kind: TokenKind,
        name: &str,
        role: Option<Role>,
        environment: Option<&str>,
        services: &[String],
        expires_in: Option<Duration>,
    ) -> Result<NewToken, BadInput> {
        let name = Name::parse("name", name)?;
        let ttl = expires_in.unwrap_or(TOKEN_TTL);
        check_ttl(ttl)?;
        match kind {
            TokenKind::Agent | TokenKind::Flags => {
                let what = if kind == TokenKind::Agent { "an agent" } else { "a flags" };
                let env = environment.ok_or_else(|| {
                    BadInput::rule("environment", "", format!("{what} token needs an environment"))
                })?;
                let environment = Name::parse("environment", env)?;
                if services.is_empty() || services.len() > MAX_AGENT_TOKEN_SERVICES {
                    return Err(BadInput::rule(
                        "services",
                        "[]",
                        format!("{what} token needs 1 to {MAX_AGENT_TOKEN_SERVICES} services"),
                    ));
                }
                let services = services
                    .iter()
                    .enumerate()
                    .map(|(i, s)| Name::parse(&format!("services[{i}]"), s))
                    .collect::<Result<Vec<_>, _>>()?;
                if role.is_some() {
                    return Err(BadInput::rule(
                        "role",
                        "",
                        format!("{} tokens have no role; omit it", kind.as_str()),
                    ));
                }
                Ok(NewToken { kind, name, role: None, environment: Some(environment), services, ttl })
            }
            TokenKind::Api => {
                if environment.is_some() || !services.is_empty() {
                    return Err(BadInput::rule(
                        "environment",
                        "",
                        "API tokens are not scoped to services; omit it",
                    ));
                }
                let role = Some(role.unwrap_or(Role::Viewer));
                Ok(NewToken { kind, name, role, environment: None, services: Vec::new(), ttl })
            }
        }
    }
}

/// A freshly minted token: its stored row and the bearer token, shown only this once.
#[derive(Clone)]
pub struct Minted {
    /// What is stored (the secret is not).
    pub row: TokenRow,
    /// The signed JWT.
    pub token: String,
}

impl std::fmt::Debug for Minted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Minted").field("row", &self.row).field("token", &"<secret>").finish()
    }
}

/// A user to create, checked for its form.
#[derive(Clone)]
pub struct NewUser {
    username: Name,
    password: String,
    role: Role,
}

impl std::fmt::Debug for NewUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewUser").field("username", &self.username).field("role", &self.role).finish()
    }
}

impl NewUser {
    /// Checks the `username` and the `password` (`auth::check_password`).
    ///
    /// # Errors
    /// [`BadInput`] naming the field (never quoting the password).
    pub fn new(username: &str, password: String, role: Role) -> Result<NewUser, BadInput> {
        let username = Name::parse("username", username)?;
        check_password(&password).map_err(|m| BadInput::new("password", "", m))?;
        Ok(NewUser { username, password, role })
    }
}

/// A change to a user: a new password, a new role, disabling or enabling it, or several of
/// these, checked for its form.
#[derive(Clone)]
pub struct UserChange {
    username: Name,
    password: Option<String>,
    role: Option<Role>,
    disabled: Option<bool>,
}

impl std::fmt::Debug for UserChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserChange")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<new>"))
            .field("role", &self.role)
            .field("disabled", &self.disabled)
            .finish()
    }
}

impl UserChange {
    /// Checks the `username`, the new `password` if any (`auth::check_password`), and that
    /// something changes.
    ///
    /// # Errors
    /// [`BadInput`] naming the field (never quoting the password).
    pub fn new(
        username: &str,
        password: Option<String>,
        role: Option<Role>,
        disabled: Option<bool>,
    ) -> Result<UserChange, BadInput> {
        let username = Name::parse("username", username)?;
        if let Some(p) = &password {
            check_password(p).map_err(|m| BadInput::new("password", "", m))?;
        }
        if password.is_none() && role.is_none() && disabled.is_none() {
            return Err(BadInput::rule(
                "role",
                "",
                "give a new password, a new role or disabled (one or more)",
            ));
        }
        Ok(UserChange { username, password, role, disabled })
    }
}

impl Actions {
    /// Mints a token (audited as `token.create`, its row as `after`).
    ///
    /// # Errors
    /// [`TokenError`]; [`TokenError::InvalidField`] on `environment` or `services[i]` when
    /// an agent token names an environment or a service that does not exist.
    pub async fn create_token(
        &self,
        by: &Actor,
        reason: &Reason,
        new: NewToken,
    ) -> Result<Minted, TokenError> {
        by.may(Action::TokenCreate)?;
        if let Some(env) = &new.environment {
            if self.store.environment(env.as_str()).await?.is_none() {
                return Err(TokenError::InvalidField(levee_agent::policy::FieldError {
                    path: "environment".into(),
                    value: format!("{:?}", env.as_str()),
                    message: "no such environment".into(),
                }));
            }
            // A token for a service that does not exist yet would silently start working
            // the day someone creates a service of that name.
            for (i, svc) in new.services.iter().enumerate() {
                if self.store.service(env.as_str(), svc.as_str()).await?.is_none() {
                    return Err(TokenError::InvalidField(levee_agent::policy::FieldError {
                        path: format!("services[{i}]"),
                        value: format!("{:?}", svc.as_str()),
                        message: format!("no such service in environment {:?}", env.as_str()),
                    }));
                }
            }
        }
        let now = now_ms();
        let row = TokenRow {
            id: uuid::Uuid::new_v4().to_string(),
            kind: new.kind,
            name: new.name.as_str().to_string(),
            role: new.role,
            environment: new.environment.map(|e| e.as_str().to_string()),
            services: new.services.iter().map(|s| s.as_str().to_string()).collect(),
            created_by: by.name.clone(),
            created_at: now,
            expires_at: now + new.ttl.as_millis() as i64,
            revoked_at: None,
            person: Some(by.person()),
        };
        let token = self.keys.mint(&row)?;
        let mut audit = audit_row(by, reason, Action::TokenCreate, format!("token {}", row.name));
        audit.after = serde_json::to_string(&row).ok();
        self.store.insert_token(&row, &audit).await?;
        Ok(Minted { row, token })
    }

    /// Revokes token `id` at once (audited as `token.revoke`): agent streams open with it
    /// end within seconds (SEC-3), and new ones are refused. Revoking a revoked token
    /// succeeds again.
    ///
    /// # Errors
    /// [`TokenError`]: [`Missing::Token`].
    pub async fn revoke_token(&self, by: &Actor, reason: &Reason, id: &str) -> Result<(), TokenError> {
        by.may(Action::TokenRevoke)?;
        let audit = audit_row(by, reason, Action::TokenRevoke, format!("token {id}"));
        if !self.store.revoke_token(id, &audit).await? {
            return Err(TokenError::NotFound(Missing::Token { id: id.to_string() }));
        }
        // Streams open with it on this replica end now; other replicas learn it from the
        // database within `listener::REVOCATION_POLL`.
        self.hub.revocations().revoke([id.to_string()]);
        Ok(())
    }

    /// Rotates token `id` (audited as `token.rotate`, the old row as `before`, the new one
    /// and the old one's end as `after`): mints a token of the same kind, name and scope
    /// (role, or environment and services) and schedules the old one's revocation at the
    /// end of the overlap, so instances that still present it keep working until the new
    /// one reached them. An overlap of 0 ends the old token now, as a revocation does; an
    /// overlap never makes a token last longer than its expiry or an earlier rotation's end.
    ///
    /// # Errors
    /// [`TokenError`]: [`Missing::Token`]; [`TokenError::Ended`] when the token is already
    /// revoked or expired.
    pub async fn rotate_token(
        &self,
        by: &Actor,
        reason: &Reason,
        id: &str,
        rotation: Rotation,
    ) -> Result<Rotated, TokenError> {
        by.may(Action::TokenRotate)?;
        let old = self
            .store
            .token(id)
            .await?
            .ok_or_else(|| TokenError::NotFound(Missing::Token { id: id.to_string() }))?;
        let now = now_ms();
        let ttl = rotation.ttl.map_or(old.expires_at - old.created_at, |t| t.as_millis() as i64);
        let row = TokenRow {
            id: uuid::Uuid::new_v4().to_string(),
            kind: old.kind,
            name: old.name.clone(),
            role: old.role,
            environment: old.environment.clone(),
            services: old.services.clone(),
            created_by: by.name.clone(),
            created_at: now,
            expires_at: now + ttl,
            revoked_at: None,
            // The same token under a new secret: it acts for the person the old one did.
            person: Some(old.person()),
        };
        let token = self.keys.mint(&row)?;
        let ends_at = now + rotation.overlap.as_millis() as i64;
        let mut audit = audit_row(by, reason, Action::TokenRotate, format!("token {}", old.name));
        audit.before = serde_json::to_string(&old).ok();
        audit.after = Some(
            serde_json::json!({
                "new": &row,
                "old_ends_at": levee_agent::policy::Timestamp::from_unix_ms(ends_at.min(old.ends_at())).to_rfc3339(),
            })
            .to_string(),
        );
        let replaced = self
            .store
            .rotate_token(id, ends_at, &row, &audit)
            .await?
            .ok_or_else(|| TokenError::NotFound(Missing::Token { id: id.to_string() }))?;
        if replaced.revoked(now_ms()) {
            // Streams open with it on this replica end now; other replicas learn it within
            // `listener::REVOCATION_POLL`, as they learn every revocation when its time comes.
            self.hub.revocations().revoke([id.to_string()]);
        }
        Ok(Rotated { minted: Minted { row, token }, replaced })
    }

    /// Changes a user's password, role and/or whether it is disabled (audited as
    /// `user.update`: the role and disabled before and after and whether the password
    /// changed; never the password or its hash). Every session the user had open ends at
    /// once; a disabled user cannot log in until enabled again.
    ///
    /// A user cannot disable or demote themselves (so the last admin cannot lock everyone
    /// out by mistake); another admin can, and so can an API token, whatever its name
    /// (identity is [`Actor::user`], never the audit name).
    ///
    /// # Errors
    /// [`TokenError`]: [`Missing::User`] when there is no such user;
    /// [`TokenError::InvalidField`] on `disabled` / `role` for a change of oneself.
    pub async fn update_user(
        &self,
        by: &Actor,
        reason: &Reason,
        change: UserChange,
    ) -> Result<(), TokenError> {
        by.may(Action::UserUpdate)?;
        let username = change.username.as_str().to_string();
        let before = self
            .store
            .user(&username)
            .await?
            .ok_or_else(|| TokenError::NotFound(Missing::User { name: username.clone() }))?;
        if by.user.as_deref() == Some(username.as_str()) {
            let refuse = |path: &str, value: String| {
                TokenError::InvalidField(levee_agent::policy::FieldError {
                    path: path.into(),
                    value,
                    message: "you cannot disable or demote yourself; another admin can".into(),
                })
            };
            if change.disabled == Some(true) {
                return Err(refuse("disabled", "true".into()));
            }
            if let Some(r) = change.role.filter(|r| *r != Role::Admin && before.role == Role::Admin) {
                return Err(refuse("role", format!("{:?}", r.as_str())));
            }
        }
        let hash = match change.password {
            Some(p) => Some(hash_password(p).await?),
            None => None,
        };
        let mut audit = audit_row(by, reason, Action::UserUpdate, format!("user {username}"));
        audit.before = Some(
            serde_json::json!({"username": username, "role": before.role, "disabled": before.disabled})
                .to_string(),
        );
        audit.after = Some(
            serde_json::json!({
                "username": username,
                "role": change.role.unwrap_or(before.role),
                "disabled": change.disabled.unwrap_or(before.disabled),
                "password_changed": hash.is_some(),
                "sessions_ended": true,
            })
            .to_string(),
        );
        let ok = self
            .store
            .update_user(&username, hash.as_deref(), change.role, change.disabled, Some(&audit))
            .await?;
        if !ok {
            return Err(TokenError::NotFound(Missing::User { name: username }));
        }
        Ok(())
    }

    /// Ends a session before its expiry (logging out): its token is refused from now on,
    /// as [`crate::auth::end_session`] says. Not audited: only the session's holder ends it.
    ///
    /// # Errors
    /// The database failed.
    pub async fn end_session(&self, jti: &str) -> anyhow::Result<()> {
        crate::auth::end_session(&self.store, jti).await
    }

    /// Creates a user with an argon2 hash of the password (audited as `user.create`, the
    /// username and role as `after`).
    ///
    /// # Errors
    /// [`CreateError`]: a user of that name exists.
    pub async fn create_user(&self, by: &Actor, reason: &Reason, new: NewUser) -> Result<(), CreateError> {
        by.may(Action::UserCreate)?;
        let username = new.username.as_str().to_string();
        let hash = hash_password(new.password).await?;
        let mut audit = audit_row(by, reason, Action::UserCreate, format!("user {username}"));
        audit.after = Some(serde_json::json!({"username": username, "role": new.role}).to_string());
        if !self.store.create_user(&username, &hash, new.role, Some(&audit)).await? {
            return Err(CreateError::AlreadyExists(Existing::User { name: username }));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_form_is_checked_field_by_field() {
        let svc = vec!["checkout".to_string()];
        let agent = |env, services: &[String], role, ttl| {
            NewToken::new(TokenKind::Agent, "checkout-prod", role, env, services, ttl)
        };
        assert_eq!(agent(Some("prod"), &svc, None, None).unwrap().ttl, Duration::from_secs(90 * 86400));
        assert_eq!(agent(None, &svc, None, None).unwrap_err().0.path, "environment");
        assert_eq!(agent(Some("prod"), &[], None, None).unwrap_err().0.path, "services");
        assert_eq!(agent(Some("prod"), &["Bad".into()], None, None).unwrap_err().0.path, "services[0]");
        assert_eq!(agent(Some("prod"), &svc, Some(Role::Admin), None).unwrap_err().0.path, "role");
        let short = agent(Some("prod"), &svc, None, Some(Duration::from_secs(59))).unwrap_err();
        assert_eq!(short.0.path, "expires_in");
        assert_eq!(short.0.message, "must be between 1m and 3650d");
        let api = NewToken::new(TokenKind::Api, "bot", None, Some("prod"), &[], None);
        assert_eq!(api.unwrap_err().0.path, "environment");
        let api = NewToken::new(TokenKind::Api, "bot", None, None, &[], None).unwrap();
        assert_eq!(api.role, Some(Role::Viewer));
    }

    #[test]
    fn passwords_are_checked_and_never_printed() {
        use crate::auth::{MAX_PASSWORD_CHARS, MIN_PASSWORD_CHARS};
        assert!(check_password("short").is_err());
        assert!(check_password(&"p".repeat(MIN_PASSWORD_CHARS)).is_ok());
        assert!(check_password(&"p".repeat(MAX_PASSWORD_CHARS + 1)).is_err());
        assert!(check_password(&"é".repeat(MAX_PASSWORD_CHARS)).is_ok());
        let u = NewUser::new("olivia", "correct horse battery".into(), Role::Operator).unwrap();
        assert!(!format!("{u:?}").contains("horse"));
        let e = NewUser::new("olivia", "short".into(), Role::Operator).unwrap_err();
        assert_eq!((e.0.path.as_str(), e.0.value.as_str()), ("password", ""));
    }
}
