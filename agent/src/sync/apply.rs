//! What the agent does with one pushed snapshot: apply, acknowledge, or reject.

use std::sync::Arc;

use tokio::time::Instant;

use crate::applied::{Applied, Source};
use crate::policy::{self, Timestamp};
use crate::proto::Snapshot;
use crate::state::Shared;

/// The verdict on one snapshot.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Valid and newer than what is applied: swap it in, persist, ACK.
    Apply(Applied),
    /// Exactly what is applied already (same revision and hash): ACK without applying.
    AlreadyApplied,
    /// Rejected with a readable reason: NACK, keep the last good configuration.
    Reject(String),
}

/// Judges `snap` against what `shared` enforces. Never applies anything itself and never
/// treats a missing, null, unparsable or invalid body as "no rules" (CP-3): only a body that
/// decodes and validates is applied, and `{}` (an explicitly empty configuration) is one.
pub(crate) fn judge(shared: &Shared, snap: &Snapshot, now: Instant, wall_now: Timestamp) -> Verdict {
    if snap.service != shared.service {
        return Verdict::Reject(format!(
            "snapshot is for service {:?}, this agent serves {:?}",
            snap.service, shared.service
        ));
    }
    if !snap.environment.is_empty() && snap.environment != shared.environment {
        return Verdict::Reject(format!(
            "snapshot is for environment {:?}, this agent runs in {:?}",
            snap.environment, shared.environment
        ));
    }
    if snap.revision == 0 {
        return Verdict::Reject("revision 0 is not a snapshot revision (revisions start at 1)".into());
    }
    let current = shared.current.load();
    if snap.revision <= current.revision {
        if snap.revision == current.revision && snap.hash == current.hash {
            return Verdict::AlreadyApplied;
        }
        return Verdict::Reject(if snap.revision == current.revision {
            format!(
                "revision {} is already applied with hash {}, refusing different content (hash {})",
                snap.revision, current.hash, snap.hash
            )
        } else {
            format!(
                "revision {} is older than the applied revision {}; an agent never goes back (monotonic apply)",
                snap.revision, current.revision
            )
        });
    }
    let actual = policy::content_hash(&snap.body);
    if actual != snap.hash {
        return Verdict::Reject(format!(
            "body hash mismatch: the body hashes to {actual}, the snapshot says {:?}",
            snap.hash
        ));
    }
    match policy::accept(snap.schema_version, &snap.body) {
        Ok(config) => Verdict::Apply(Applied::new(
            config,
            snap.revision,
            snap.hash.clone(),
            Source::Live,
            // `accept` refuses a body that is not UTF-8.
            Some(Arc::from(String::from_utf8_lossy(&snap.body).as_ref())),
            now,
            wall_now,
        )),
        Err(e) => Verdict::Reject(rejection(&e)),
    }
}

/// The NACK reason for a body [`policy::accept`] refused.
fn rejection(e: &policy::PolicyError) -> String {
    match e {
        policy::PolicyError::Malformed { path, message, .. } => {
            format!("body is not a valid configuration: at {path}: {message}")
        }
        policy::PolicyError::Invalid(errors) => format!("configuration is invalid: {errors}"),
        policy::PolicyError::Refused(e) => format!("snapshot refused: {e}"),
    }
}
