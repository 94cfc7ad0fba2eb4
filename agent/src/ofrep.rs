//! The OpenFeature Remote Evaluation Protocol (OFREP): its request and answer shapes and
//! the one mapping from a Levee flag to an OFREP evaluation. The server's endpoints and the
//! sidecar (`levee sidecar`) both answer through it, so a provider sees the same answer
//! from either.
//!
//! # The mapping
//! * A key is a flag of the service the caller reads (one service per request: the token's
//!   only service, else `context.service`). The context's `targetingKey` is the rollout key;
//!   no other attribute changes an answer.
//! * A flag that is set answers its value with reason `STATIC` (`CACHED` from an agent
//!   whose snapshot the server has not confirmed) and variant `value`.
//! * A bool flag with a rollout: a `targetingKey` inside it gets the value (`SPLIT`, variant
//!   `rollout`), one outside it gets the caller's code default (no `value`, reason
//!   `DEFAULT`, variant `default`); without a
//!   `targetingKey` the evaluation fails with `TARGETING_KEY_MISSING`, unless the rollout
//!   covers every key.
//! * A flag that is absent, expired, or past its stale limit (`revert_after`, sidecar
//!   only) is `FLAG_NOT_FOUND`: the caller's default applies, as it does for a handle.
//! * Type mismatches are found by the provider, which knows the type it asked for, from
//!   the JSON type of `value` (`bool` → boolean, `int` → integer, `float` → number, `string`,
//!   `json` → object).

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::applied::{BoolAnswer, Split};
use crate::policy::{Flag, FlagType, ServiceConfig, Timestamp};

/// Most bytes of an evaluation request body.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024;
/// Most bytes of a `targetingKey`.
pub const MAX_TARGETING_KEY_BYTES: usize = 256;
/// Most attributes of an evaluation context.
pub const MAX_CONTEXT_FIELDS: usize = 64;
/// The context attribute that names the service to read, for a caller that may read several.
pub const SERVICE_ATTRIBUTE: &str = "service";

/// What an evaluation reads from the request's context.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Context {
    /// `targetingKey`: the rollout key.
    pub targeting_key: Option<String>,
    /// `service`: which of the caller's services to read.
    pub service: Option<String>,
}

/// OFREP error codes Levee answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ErrorCode {
    /// The body is not a JSON object.
    ParseError,
    /// A rollout needs `targetingKey` and the context has none.
    TargetingKeyMissing,
    /// The context is not an object, or an attribute Levee reads is of the wrong type or
    /// size.
    InvalidContext,
    /// No such flag is set for the service.
    FlagNotFound,
}

impl ErrorCode {
    /// The protocol's spelling (`FLAG_NOT_FOUND`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::ParseError => "PARSE_ERROR",
            ErrorCode::TargetingKeyMissing => "TARGETING_KEY_MISSING",
            ErrorCode::InvalidContext => "INVALID_CONTEXT",
            ErrorCode::FlagNotFound => "FLAG_NOT_FOUND",
        }
    }

    /// The HTTP status of a request that fails with this code: 404 for `FLAG_NOT_FOUND`,
    /// 400 for the caller's mistakes.
    pub const fn status(self) -> u16 {
        match self {
            ErrorCode::FlagNotFound => 404,
            ErrorCode::ParseError | ErrorCode::TargetingKeyMissing | ErrorCode::InvalidContext => 400,
        }
    }
}

/// A failed evaluation: of one flag (with its key) or of a whole request.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Failure {
    /// The flag's key; absent when the whole request failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// What failed.
    pub error_code: ErrorCode,
    /// For a person: what was wrong and what is allowed.
    pub error_details: String,
}

impl Failure {
    /// A failure of the whole request.
    pub fn request(code: ErrorCode, details: impl Into<String>) -> Self {
        Self { key: None, error_code: code, error_details: details.into() }
    }

    /// The same failure, naming the flag a single evaluation asked for.
    pub fn for_key(self, key: &str) -> Self {
        Self { key: Some(key.to_string()), ..self }
    }

    fn flag(key: &str, code: ErrorCode, details: String) -> Self {
        Self { key: Some(key.to_string()), error_code: code, error_details: details }
    }

    /// The failure of a request for `key`, whose flag is not set.
    pub fn not_found(key: &str) -> Self {
        Self::flag(
            key,
            ErrorCode::FlagNotFound,
            format!("flag {key:?} is not set for this service (absent, expired, or past its stale limit)"),
        )
    }
}

/// Why an evaluation answered what it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Reason {
    /// The flag's value, from a configuration the server confirmed.
    Static,
    /// The flag's value, from a configuration not (yet) confirmed by the server: the
    /// sidecar's disk cache while the server is away.
    Cached,
    /// The caller's key decided: inside a rollout (the value) or outside it (no value).
    Split,
    /// Outside a rollout: the caller's code default (no value).
    Default,
}

/// A successful evaluation.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Success {
    /// The flag's key.
    pub key: String,
    /// The value; absent when the caller's code default applies.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Value>))]
    pub value: Option<serde_json::Value>,
    /// Why.
    pub reason: Reason,
    /// Where the answer came from: `value` (the flag's value), `rollout` (inside a
    /// rollout) or `default` (outside one: no `value`).
    pub variant: &'static str,
    /// `type` (Levee's flag type: `bool`, `int`, `float`, `string`, `json`), `owner` and
    /// `expires_at` (RFC 3339) when set.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub metadata: BTreeMap<&'static str, String>,
}

/// One evaluation: a success or a failure.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Evaluation {
    /// A value (or the caller's default).
    Success(Success),
    /// A failure naming the flag.
    Failure(Failure),
}

/// The answer to a bulk evaluation: every flag of the service, in key order.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Bulk {
    /// Each flag's evaluation.
    pub flags: Vec<Evaluation>,
    /// `environment`, `service` and `revision` (the snapshot evaluated).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub metadata: BTreeMap<&'static str, String>,
}

impl Bulk {
    /// The body and its entity tag: the first 16 bytes of the body's SHA-256, hex, quoted.
    /// The tag changes exactly when the answer does (a flip, a new flag, a rollout key
    /// moving inside), so a provider's `If-None-Match` gets 304 while nothing changed.
    pub fn to_body(&self) -> (Vec<u8>, String) {
        let body = serde_json::to_vec(self).expect("a bulk answer serializes");
        let digest = Sha256::digest(&body);
        (body, format!("\"{}\"", hex::encode(&digest[..16])))
    }
}

/// Whether an `If-None-Match` header value names `etag` (or is `*`): a list of tags,
/// weak or strong, compared weakly (RFC 9110 §13.1.2).
pub fn etag_matches(if_none_match: &str, etag: &str) -> bool {
    let bare = |t: &str| t.trim().trim_start_matches("W/").to_string();
    let etag = bare(etag);
    if_none_match.split(',').any(|t| t.trim() == "*" || bare(t) == etag)
}

/// Reads an evaluation request: a JSON object whose `context` (optional) is an object;
/// `targetingKey` and `service`, when present, strings of at most
/// [`MAX_TARGETING_KEY_BYTES`]; at most [`MAX_CONTEXT_FIELDS`] attributes. Other members
/// and attributes are accepted and ignored.
///
/// # Errors
/// `PARSE_ERROR` for a body that is not a JSON object (or is over [`MAX_REQUEST_BYTES`]),
/// `INVALID_CONTEXT` naming the attribute otherwise.
pub fn parse_request(body: &[u8]) -> Result<Context, Failure> {
    if body.len() > MAX_REQUEST_BYTES {
        return Err(Failure::request(
            ErrorCode::ParseError,
            format!("the request body is {} bytes; at most {MAX_REQUEST_BYTES} are read", body.len()),
        ));
    }
    let doc: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| Failure::request(ErrorCode::ParseError, format!("the request body is not JSON: {e}")))?;
    let serde_json::Value::Object(doc) = doc else {
        return Err(Failure::request(
            ErrorCode::ParseError,
            "the request body must be a JSON object: {\"context\": {...}}",
        ));
    };
    let context = match doc.get("context") {
        None | Some(serde_json::Value::Null) => return Ok(Context::default()),
        Some(serde_json::Value::Object(c)) => c,
        Some(_) => {
            return Err(Failure::request(ErrorCode::InvalidContext, "context must be a JSON object"));
        }
    };
    if context.len() > MAX_CONTEXT_FIELDS {
        return Err(Failure::request(
            ErrorCode::InvalidContext,
            format!("context has {} attributes; at most {MAX_CONTEXT_FIELDS} are allowed", context.len()),
        ));
    }
    let text = |name: &str| -> Result<Option<String>, Failure> {
        match context.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) if s.len() <= MAX_TARGETING_KEY_BYTES => Ok(Some(s.clone())),
            Some(serde_json::Value::String(s)) => Err(Failure::request(
                ErrorCode::InvalidContext,
                format!("context.{name} is {} bytes; at most {MAX_TARGETING_KEY_BYTES} are allowed", s.len()),
            )),
            Some(_) => {
                Err(Failure::request(ErrorCode::InvalidContext, format!("context.{name} must be a string")))
            }
        }
    };
    Ok(Context { targeting_key: text("targetingKey")?, service: text(SERVICE_ATTRIBUTE)? })
}

/// Evaluates the flag `key`, already resolved by the caller (`None`: absent, expired or
/// stale), for `ctx`; `reason` is what a plain value answers with ([`Reason::Static`] or
/// [`Reason::Cached`]). The one statement of the mapping in the module's documentation.
pub fn evaluate(key: &str, flag: Option<&Flag>, ctx: &Context, reason: Reason) -> Evaluation {
    let Some(flag) = flag else { return Evaluation::Failure(Failure::not_found(key)) };
    let success = |value: Option<serde_json::Value>, reason: Reason| {
        let variant = match (&value, reason) {
            (None, _) => "default",
            (Some(_), Reason::Split) => "rollout",
            (Some(_), _) => "value",
        };
        Evaluation::Success(Success {
            key: key.to_string(),
            value,
            reason,
            variant,
            metadata: metadata(flag),
        })
    };
    if flag.kind != FlagType::Bool || flag.rollout.is_none() {
        return success(Some(flag.value.clone()), reason);
    }
    // The default given to the rule never shows: outside a rollout the caller's code
    // default applies, which only the caller knows.
    let answer = BoolAnswer::of(Some(flag), false);
    match (answer.split, &ctx.targeting_key) {
        (None, _) => success(Some(flag.value.clone()), reason),
        (Some(s), _) if s.covers_all() => success(Some(s.value.into()), reason),
        (Some(s), Some(k)) if Split::inside(s.threshold, key, k) => {
            success(Some(s.value.into()), Reason::Split)
        }
        (Some(_), Some(_)) => success(None, Reason::Default),
        (Some(_), None) => Evaluation::Failure(Failure::flag(
            key,
            ErrorCode::TargetingKeyMissing,
            format!(
                "flag {key:?} is rolled out to {}% of keys: send context.targetingKey",
                flag.rollout.as_ref().map_or(0.0, |r| r.percent)
            ),
        )),
    }
}

fn metadata(flag: &Flag) -> BTreeMap<&'static str, String> {
    let mut m = BTreeMap::from([("type", flag.kind.as_str().to_string())]);
    if !flag.owner.is_empty() {
        m.insert("owner", flag.owner.clone());
    }
    if let Some(at) = flag.expires_at {
        m.insert("expires_at", at.to_rfc3339());
    }
    m
}

/// Evaluates every flag `resolve` answers for (keys it resolves to `None` are left out:
/// they are not set), in key order.
pub fn evaluate_all<'a>(
    keys: impl IntoIterator<Item = &'a str>,
    resolve: impl Fn(&str) -> Option<&'a Flag>,
    ctx: &Context,
    reason: Reason,
    metadata: BTreeMap<&'static str, String>,
) -> Bulk {
    let flags =
        keys.into_iter().filter_map(|k| resolve(k).map(|f| evaluate(k, Some(f), ctx, reason))).collect();
    Bulk { flags, metadata }
}

/// A flag of a stored configuration as the server reads it at `now`: absent once its
/// `expires_at` has passed (the server's sweeper removes it moments later; an answer in
/// between must not differ from an agent's). The server is the source, so no stale
/// limit applies.
pub fn stored_flag<'a>(config: &'a ServiceConfig, key: &str, now: Timestamp) -> Option<&'a Flag> {
    config.flags.get(key).filter(|f| f.expires_at.is_none_or(|at| at > now))
}

/// Bulk metadata naming the snapshot evaluated.
pub fn snapshot_metadata(environment: &str, service: &str, revision: u64) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("environment", environment.to_string()),
        ("service", service.to_string()),
        ("revision", revision.to_string()),
    ])
}

/// OFREP over an agent's applied snapshot: what the sidecar serves. Resolution is the
/// agent's (expiry and stale limits on its monotonic clock); a snapshot not confirmed by
/// the server answers [`Reason::Cached`].
impl crate::Agent {
    /// Evaluates the flag `key` for `ctx`.
    pub fn ofrep_evaluate(&self, key: &str, ctx: &Context) -> Evaluation {
        let shared = self.shared();
        let reason = reason_of(shared.current.load().source);
        shared.with_ctx(|rc| {
            let flag = rc.applied.config.flags.get(key).and_then(|f| rc.resolve(key, f.kind).0.ok());
            evaluate(key, flag, ctx, reason)
        })
    }

    /// Evaluates every flag of the applied snapshot for `ctx`.
    pub fn ofrep_evaluate_all(&self, ctx: &Context) -> Bulk {
        let shared = self.shared();
        shared.with_ctx(|rc| {
            let applied = rc.applied;
            let meta = snapshot_metadata(self.environment(), self.service(), applied.revision);
            evaluate_all(
                applied.config.flags.keys().map(String::as_str),
                |k| applied.config.flags.get(k).and_then(|f| rc.resolve(k, f.kind).0.ok()),
                ctx,
                reason_of(applied.source),
                meta,
            )
        })
    }
}

fn reason_of(source: crate::Source) -> Reason {
    match source {
        crate::Source::Live => Reason::Static,
        crate::Source::Cache | crate::Source::Default => Reason::Cached,
    }
}

#[cfg(test)]
mod tests;
