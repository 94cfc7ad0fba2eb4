//! The policy model: the contract between the Levee server and its agents.
//!
//! [`ServiceConfig`] is the body of a snapshot: a service's [`Policy`] (deadlines,
//! dependencies, inbound admission, degradation matrix) plus its [`Flag`]s, fault rules
//! and breaker overrides. Both halves decode it with [`decode_config`] /
//! [`decode_policy`], which report the JSON path of a malformed field, and check it with
//! `validate()`, which reports every out-of-range field at once.

pub mod defaults;
pub mod duration;
mod lint;
mod model;
mod timestamp;
mod validate;

pub use lint::{Lint, lint};
pub use model::*;
pub use timestamp::{Timestamp, rfc3339};
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

/// Refuses a struct written as a JSON array. serde's derived structs accept the sequence
/// form (`[]` decodes to an all-defaults value), which would let an empty or truncated
/// payload silently clear rules; every place the model has an object must be an object
/// (or absent) in the input.
fn check_objects(
    input: &serde_json::Value,
    output: &serde_json::Value,
    path: &str,
) -> Result<(), PolicyError> {
    use serde_json::Value;
    match (input, output) {
        (Value::Object(i), Value::Object(o)) => {
            for (k, ov) in o {
                if let Some(iv) = i.get(k) {
                    let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                    check_objects(iv, ov, &p)?;
                }
            }
            Ok(())
        }
        (Value::Array(i), Value::Array(o)) => {
            for (n, (iv, ov)) in i.iter().zip(o).enumerate() {
                check_objects(iv, ov, &format!("{path}[{n}]"))?;
            }
            Ok(())
        }
        (Value::Array(_), Value::Object(_)) => Err(PolicyError::Malformed {
            path: if path.is_empty() { ".".into() } else { path.to_string() },
            message: "expected an object, found an array".into(),
        }),
        _ => Ok(()),
    }
}

fn decode_strict<T: DeserializeOwned + serde::Serialize>(bytes: &[u8]) -> Result<T, PolicyError> {
    let value: T = decode(bytes)?;
    let input: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| PolicyError::Malformed { path: ".".into(), message: e.to_string() })?;
    let output = serde_json::to_value(&value).expect("the policy model always serializes");
    check_objects(&input, &output, "")?;
    Ok(value)
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
    let cfg: ServiceConfig = decode_strict(bytes)?;
    cfg.validate()?;
    Ok(cfg)
}

/// Decodes and validates a policy document (JSON), as `PUT .../policy` takes it.
///
/// # Errors
/// As [`decode_config`].
pub fn decode_policy(bytes: &[u8]) -> Result<Policy, PolicyError> {
    let p: Policy = decode_strict(bytes)?;
    p.validate()?;
    Ok(p)
}

/// Decodes any JSON request type with path-aware errors, without range validation. The
/// document must be a JSON object.
///
/// # Errors
/// [`PolicyError::Malformed`].
pub fn decode_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, PolicyError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => decode(bytes),
        _ => Err(PolicyError::Malformed { path: ".".into(), message: "expected a JSON object".into() }),
    }
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
