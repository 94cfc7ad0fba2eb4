//! Environments.

use super::{Action, Actions, Actor, BadInput, CreateError, Existing, Name, Reason, audit_row, check_text};
use crate::db::EnvironmentRow;

/// An environment to create.
#[derive(Clone, Debug)]
pub struct NewEnvironment {
    name: Name,
    description: String,
    allow_faults: bool,
}

impl NewEnvironment {
    /// Checks the form of a new environment: its `name`, and its `description` as free
    /// text ([`check_text`]). `allow_faults` permits fault-injection rules in it.
    ///
    /// # Errors
    /// [`BadInput`] naming the field.
    pub fn new(name: &str, description: String, allow_faults: bool) -> Result<NewEnvironment, BadInput> {
        let name = Name::parse("name", name)?;
        check_text("description", &description)?;
        Ok(NewEnvironment { name, description, allow_faults })
    }
}

impl Actions {
    /// Creates an environment (audited as `environment.create`, with its description and
    /// `allow_faults` as `after`) and returns it.
    ///
    /// # Errors
    /// [`CreateError`]: one of that name exists.
    pub async fn create_environment(
        &self,
        by: &Actor,
        reason: &Reason,
        new: NewEnvironment,
    ) -> Result<EnvironmentRow, CreateError> {
        by.may(Action::EnvironmentCreate)?;
        let name = new.name.as_str();
        let mut audit = audit_row(by, reason, Action::EnvironmentCreate, name.to_string());
        audit.environment = Some(name.to_string());
        audit.after = Some(
            serde_json::json!({"description": new.description, "allow_faults": new.allow_faults}).to_string(),
        );
        self.store
            .create_environment(name, &new.description, new.allow_faults, &audit)
            .await?
            .ok_or_else(|| CreateError::AlreadyExists(Existing::Environment { name: name.to_string() }))
    }
}
