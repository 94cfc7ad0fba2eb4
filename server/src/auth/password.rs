//! Passwords: what a new one may be, and argon2id hashes (computed and checked on a
//! blocking thread).

use argon2::Argon2;
use argon2::password_hash::phc::PasswordHash;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};

/// Fewest characters of a password.
pub const MIN_PASSWORD_CHARS: usize = 12;
/// Most bytes of a password.
pub const MAX_PASSWORD_BYTES: usize = 1024;

/// Most characters of a new password: at most four bytes each, so never past
/// [`MAX_PASSWORD_BYTES`]. Counted in characters, as the OpenAPI document's `maxLength` is.
pub const MAX_PASSWORD_CHARS: usize = MAX_PASSWORD_BYTES / 4;

/// Checks a new password: [`MIN_PASSWORD_CHARS`] to [`MAX_PASSWORD_CHARS`] characters.
///
/// # Errors
/// What is allowed, in words.
pub fn check_password(password: &str) -> Result<(), String> {
    let chars = password.chars().count();
    if !(MIN_PASSWORD_CHARS..=MAX_PASSWORD_CHARS).contains(&chars) {
        return Err(format!("must be {MIN_PASSWORD_CHARS} to {MAX_PASSWORD_CHARS} characters long"));
    }
    Ok(())
}

/// Hashes a password with argon2id (default parameters). Runs on a blocking thread.
pub async fn hash_password(password: String) -> anyhow::Result<String> {
    tokio::task::spawn_blocking(move || {
        Argon2::default()
            .hash_password(password.as_bytes())
            .map(|h| h.to_string())
            .map_err(|e| anyhow::anyhow!("hashing password: {e}"))
    })
    .await?
}

/// Checks a password against a PHC string. Runs on a blocking thread.
pub async fn verify_password(password: String, phc: String) -> bool {
    tokio::task::spawn_blocking(move || {
        PasswordHash::new(&phc)
            .map(|h| Argon2::default().verify_password(password.as_bytes(), &h).is_ok())
            .unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}
