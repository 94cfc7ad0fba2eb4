//! What a new stream of the agent-facing gRPC services (`sync`, `xds`) must pass before it
//! gets anything, and how each refusal is told: a server that is stopping, the bearer
//! token, the token checked against its row on the database's runtime, and the token's
//! scope. Both services carry an agent token; each adds its own checks (the new-stream
//! rate limit and the memory of recently verified tokens are the sync service's).

use tokio::sync::watch;
use tonic::{Request, Status};

use crate::auth::{AgentPrincipal, AuthError, Keys, ScopeError, authenticate_agent, bearer_token};
use crate::db::Store;
use crate::runtime::DbRuntime;

/// A stopping server refuses new streams before reading anything: the client reconnects,
/// to another replica.
///
/// # Errors
/// `UNAVAILABLE` once `shutdown` is set.
pub fn refuse_if_stopping(shutdown: &watch::Receiver<bool>) -> Result<(), Status> {
    if crate::shutdown::is_stopped(shutdown) {
        return Err(Status::unavailable("server shutting down; reconnect with backoff"));
    }
    Ok(())
}

/// The bearer token of a request's `authorization` metadata.
pub fn bearer<T>(req: &Request<T>) -> Option<String> {
    let value = req.metadata().get("authorization")?.to_str().ok()?;
    bearer_token(value).map(str::to_string)
}

/// Checks an agent token against its row, on `db` (the runtime that drives the store's
/// connections, wherever the stream runs); a runtime shutting down counts as a database
/// that cannot answer.
///
/// # Errors
/// The token's refusal; [`AuthError::Unavailable`] when it cannot be checked now.
pub async fn authenticate(
    db: &DbRuntime,
    keys: &Keys,
    store: &Store,
    token: &str,
) -> Result<AgentPrincipal, AuthError> {
    let (keys, store, token) = (keys.clone(), store.clone(), token.to_string());
    db.run(async move { authenticate_agent(&keys, &store, &token).await })
        .await
        .unwrap_or_else(|| Err(AuthError::Unavailable("the server is stopping".into())))
}

/// How a token that was not checked is told: `UNAVAILABLE`, never an authentication
/// failure (an agent told its token is refused backs off for minutes).
pub fn unavailable() -> Status {
    Status::unavailable("the token cannot be checked now: the database is unavailable; retry with backoff")
}

/// How a refused token is told.
pub fn refused(e: &AuthError) -> Status {
    match e {
        AuthError::Unavailable(_) => unavailable(),
        e => Status::unauthenticated(format!("agent token refused: {e}")),
    }
}

/// How a stream outside the token's scope is told.
pub fn out_of_scope(e: &ScopeError) -> Status {
    Status::permission_denied(e.to_string())
}
