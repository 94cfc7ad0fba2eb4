//! The policy model: the contract between the Levee server and its agents.
//!
//! [`ServiceConfig`] is the body of a snapshot: a service's [`Policy`] (deadlines,
//! dependencies, inbound admission, degradation matrix) plus its [`Flag`]s, fault rules
//! and breaker overrides. Both halves decode it with [`decode_config`] /
//! [`decode_policy`], which report the JSON path of a malformed field, and check it with
//! `validate()`, which reports every out-of-range field at once.

pub mod defaults;
mod lint;
mod model;
mod timestamp;
mod validate;

pub use lint::{Lint, lint};
pub use model::*;
pub use timestamp::Timestamp;
pub use validate::{FieldError, ValidationErrors, check_name, check_operation};

use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

/// Version of the snapshot body schema. Bumped on any incompatible change; an agent
/// refuses a cached or pushed snapshot of a version it does not know.
pub const SCHEMA_VERSION: u32 = 1;

/// Why a document could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Not JSON of the right shape; `path` names where decoding stopped.
    #[error("{path}: {message}")]
    Malformed {
        /// JSON path of the bad field (`.` for the document itself).
        path: String,
        /// What the decoder expected.
        message: String,
    },
    /// Well-formed, but fields are out of range.
    #[error("{0}")]
    Invalid(#[from] ValidationErrors),
}

impl PolicyError {
    /// Every bad field as [`FieldError`]s (one for a malformed document).
    pub fn field_errors(&self) -> Vec<FieldError> {
        match self {
            PolicyError::Malformed { path, message } => {
                vec![FieldError { path: path.clone(), value: String::new(), message: message.clone() }]
            }
            PolicyError::Invalid(v) => v.0.clone(),
        }
    }
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, PolicyError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = match e.path().to_string() {
            p if p == "?" || p.is_empty() => ".".to_string(),
            p => p,
        };
        let inner = e.into_inner();
        // serde_json appends " at line L column C"; keep it, it helps people find the spot.
        PolicyError::Malformed { path, message: inner.to_string() }
    })
}

/// Decodes and validates a snapshot body (JSON).
///
/// # Errors
/// [`PolicyError::Malformed`] for bad JSON, unknown fields or wrong types (with the path);
/// [`PolicyError::Invalid`] listing every out-of-range field.
pub fn decode_config(bytes: &[u8]) -> Result<ServiceConfig, PolicyError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(PolicyError::Malformed { path: ".".into(), message: "empty body".into() });
    }
    let cfg: ServiceConfig = decode(bytes)?;
    cfg.validate()?;
    Ok(cfg)
}

/// Decodes and validates a policy document (JSON), as `PUT .../policy` takes it.
///
/// # Errors
/// As [`decode_config`].
pub fn decode_policy(bytes: &[u8]) -> Result<Policy, PolicyError> {
    let p: Policy = decode(bytes)?;
    p.validate()?;
    Ok(p)
}

/// Decodes any model type with path-aware errors, without range validation.
///
/// # Errors
/// [`PolicyError::Malformed`].
pub fn decode_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, PolicyError> {
    decode(bytes)
}

/// Canonical JSON bytes of a configuration (maps are ordered, so equal configs give equal
/// bytes). This is what the server stores and hashes.
pub fn canonical_json(cfg: &ServiceConfig) -> Vec<u8> {
    serde_json::to_vec(cfg).expect("the policy model always serializes")
}

/// Lower-case hex SHA-256 of a snapshot body.
pub fn content_hash(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

#[cfg(test)]
mod tests;
