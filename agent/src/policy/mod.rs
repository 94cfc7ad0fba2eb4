//! The policy model: the contract between the Levee server and its agents.
//!
//! [`ServiceConfig`] is the body of a snapshot: a service's [`Policy`] (deadlines,
//! dependencies, inbound admission, degradation matrix) plus its [`Flag`]s, fault rules
//! and breaker overrides. Both halves decide whether a snapshot body is acceptable with
//! [`accept`] (schema version, size and depth budgets, then [`decode_config`]); documents
//! are decoded with [`decode_config`] / [`decode_policy`], which report the JSON path of a
//! malformed field, and checked with `validate()`, which reports every out-of-range field
//! at once.

mod accept;
pub mod defaults;
pub mod duration;
mod lint;
mod model;
pub mod recover;
mod timestamp;
mod validate;

pub use accept::accept;
pub use lint::{Lint, lint};
pub use model::*;
pub use timestamp::{Timestamp, rfc3339};
pub use validate::{FieldError, MIN_ATTEMPT_TIMEOUT, ValidationErrors, check_name, check_operation};

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
        /// What the decoder expected, and the allowed range when `validate()` states one.
        message: String,
        /// The bad value as written (JSON), when the decoder got that far; else empty.
        value: String,
        /// The other problems of the same document, found by skipping each bad field
        /// ([`recover::decode_all`]) and validating what remains: other fields of the
        /// wrong type, unknown fields, out-of-range values.
        also: Vec<FieldError>,
    },
    /// Well-formed, but fields are out of range.
    #[error("{0}")]
    Invalid(#[from] ValidationErrors),
    /// Refused before decoding: by [`accept`] for a schema version this agent does not read
    /// or a body over the size budget (`defaults::MAX_SNAPSHOT_BYTES`), by every decoder
    /// for nesting past `defaults::MAX_BODY_DEPTH`. The message states the limit, `value`
    /// what was found.
    #[error("{0}")]
    Refused(FieldError),
}

impl PolicyError {
    /// Every bad field as [`FieldError`]s (one for a malformed document).
    pub fn field_errors(&self) -> Vec<FieldError> {
        match self {
            PolicyError::Malformed { path, message, value, also } => {
                let first = FieldError { path: path.clone(), value: value.clone(), message: message.clone() };
                std::iter::once(first).chain(also.iter().cloned()).collect()
            }
            PolicyError::Invalid(v) => v.0.clone(),
            PolicyError::Refused(e) => vec![e.clone()],
        }
    }
}

/// Checks of a decoded document that [`decode`] runs on what remains after skipping bad
/// fields, so one malformed field does not hide the out-of-range ones.
type Validate<T> = fn(&T) -> Result<(), ValidationErrors>;

fn decode<T: DeserializeOwned>(bytes: &[u8], validate: Option<Validate<T>>) -> Result<T, PolicyError> {
    if let Some(refused) = accept::too_deep(bytes) {
        return Err(refused);
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = match e.path().to_string() {
            p if p == "?" || p.is_empty() => ".".to_string(),
            p => p,
        };
        let parts = recover::path_parts(e.path());
        let inner = e.into_inner().to_string();
        // serde_json appends " at line L column C"; keep it, it helps people find the spot.
        let message = match &parts {
            Some(p) => recover::explain(p, &inner),
            None => inner,
        };
        let mut also = Vec::new();
        let mut value = String::new();
        if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(bytes) {
            let (rest, problems) = recover::decode_all::<T>(doc);
            for p in problems {
                if p.path == path && value.is_empty() {
                    value = p.value;
                } else {
                    also.push(p);
                }
            }
            if let (Some(rest), Some(validate)) = (rest, validate)
                && let Err(errors) = validate(&rest)
            {
                also.extend(errors.0);
            }
        }
        PolicyError::Malformed { path, message, value, also }
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
            value: String::new(),
            also: Vec::new(),
        }),
        _ => Ok(()),
    }
}

fn decode_strict<T: DeserializeOwned + serde::Serialize>(
    bytes: &[u8],
    validate: Validate<T>,
) -> Result<T, PolicyError> {
    let value: T = decode(bytes, Some(validate))?;
    let input: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| PolicyError::Malformed {
        path: ".".into(),
        message: e.to_string(),
        value: String::new(),
        also: Vec::new(),
    })?;
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
        return Err(PolicyError::Malformed {
            path: ".".into(),
            message: "empty body".into(),
            value: String::new(),
            also: Vec::new(),
        });
    }
    let cfg: ServiceConfig = decode_strict(bytes, ServiceConfig::validate)?;
    cfg.validate()?;
    Ok(cfg)
}

/// Decodes and validates a policy document (JSON), as `PUT .../policy` takes it.
///
/// # Errors
/// As [`decode_config`].
pub fn decode_policy(bytes: &[u8]) -> Result<Policy, PolicyError> {
    let p: Policy = decode_strict(bytes, Policy::validate)?;
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
        Some(b'{') => decode(bytes, None),
        _ => Err(PolicyError::Malformed {
            path: ".".into(),
            message: "expected a JSON object".into(),
            value: String::new(),
            also: Vec::new(),
        }),
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
