//! After `levee restore`: the restored services move past every revision agents may have
//! applied from the lost writes.

use super::{Action, Actions, Actor, Forbidden, Reason, audit_row};

impl Actions {
    /// Moves every live service to a new revision `gap` above the restored one, with the
    /// same content, audited as `service.restore` (one row per service). Agents that
    /// applied a revision written after the backup (lost with it) never go back, so
    /// without this they would refuse the restored configuration and every change up to
    /// the revision they hold. Returns (environment, service, from, to) of each.
    ///
    /// # Errors
    /// The actor is not an admin, or the database failed.
    pub async fn restored(
        &self,
        by: &Actor,
        reason: &Reason,
        gap: u64,
    ) -> Result<Vec<(String, String, u64, u64)>, RestoreError> {
        by.may(Action::Restore)?;
        let template = audit_row(by, reason, Action::Restore, String::new());
        Ok(self.store.advance_revisions(gap, &template).await?)
    }
}

/// Why [`Actions::restored`] failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The actor may not.
    #[error(transparent)]
    Forbidden(#[from] Forbidden),
    /// The database failed.
    #[error(transparent)]
    Db(#[from] anyhow::Error),
}
