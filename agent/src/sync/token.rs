//! Where the agent's token comes from: a string given at build, or a file read again before
//! every connection attempt, so a rotated token (`levee tokens rotate`) reaches a running
//! instance through its file — a mounted Kubernetes or compose secret, or one a sidecar
//! rewrites — without a restart.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};

/// How often a token file is read again while the server refuses the token in use (the
/// refusal's long backoff ends as soon as the file holds another token).
pub const TOKEN_FILE_POLL: Duration = Duration::from_secs(5);

/// The token of one agent, as the `authorization` value it sends.
pub(crate) struct TokenSource {
    file: Option<PathBuf>,
    /// The token in use (trimmed text).
    text: String,
    header: MetadataValue<Ascii>,
}

/// Why a token could not be taken.
#[derive(Debug)]
pub(crate) enum TokenProblem {
    /// Not visible ASCII, or an empty file.
    Invalid,
    /// The file could not be read.
    Unreadable(std::io::Error),
}

impl TokenSource {
    /// A token given as a string.
    pub(crate) fn fixed(token: &str) -> Result<TokenSource, TokenProblem> {
        let text = token.to_string();
        let header = header(&text)?;
        Ok(TokenSource { file: None, text, header })
    }

    /// A token read from `path` now, and again before each connection attempt.
    pub(crate) fn file(path: &Path) -> Result<TokenSource, TokenProblem> {
        let text = read(path)?;
        if text.is_empty() {
            return Err(TokenProblem::Invalid);
        }
        let header = header(&text)?;
        Ok(TokenSource { file: Some(path.to_path_buf()), text, header })
    }

    /// The `authorization` value to send.
    pub(crate) fn header(&self) -> &MetadataValue<Ascii> {
        &self.header
    }

    /// The token in the file when it differs from the one in use and can be used; `None`
    /// for a token given as a string, an unchanged file, or one that cannot be read or
    /// holds no valid token (the one in use is kept: a half-written file must not cost
    /// the agent its connection).
    fn on_disk(&self) -> Option<(String, MetadataValue<Ascii>)> {
        let path = self.file.as_deref()?;
        // A few hundred bytes, read once per connection attempt or poll, on the sync task
        // (never on a request path); a blocking read keeps the paused-clock tests exact.
        let text = read(path).ok()?;
        if text.is_empty() || text == self.text {
            return None;
        }
        header(&text).ok().map(|h| (text, h))
    }

    /// Takes the file's token when it changed; returns whether it did.
    pub(crate) fn reload(&mut self) -> bool {
        match self.on_disk() {
            Some((text, header)) => {
                self.text = text;
                self.header = header;
                tracing::info!(
                    file = ?self.file,
                    "the agent token file holds a new token; using it from this connection on"
                );
                true
            }
            None => false,
        }
    }

    /// Resolves once the file holds another usable token (checked every
    /// [`TOKEN_FILE_POLL`]); never for a token given as a string.
    pub(crate) async fn changed(&self) {
        if self.file.is_none() {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(TOKEN_FILE_POLL).await;
            if self.on_disk().is_some() {
                return;
            }
        }
    }
}

fn read(path: &Path) -> Result<String, TokenProblem> {
    std::fs::read_to_string(path).map(|t| t.trim().to_string()).map_err(TokenProblem::Unreadable)
}

fn header(token: &str) -> Result<MetadataValue<Ascii>, TokenProblem> {
    let mut h: MetadataValue<Ascii> = format!("Bearer {token}").parse().map_err(|_| TokenProblem::Invalid)?;
    h.set_sensitive(true);
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_token_is_trimmed_and_taken_again_only_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first-token\n").unwrap();
        let mut t = TokenSource::file(&path).unwrap();
        assert_eq!(t.header().to_str().unwrap(), "Bearer first-token");
        assert!(!t.reload(), "unchanged");
        // Half written (empty) or not header text: the token in use is kept.
        std::fs::write(&path, "").unwrap();
        assert!(!t.reload());
        std::fs::write(&path, "bad\u{7f}token").unwrap();
        assert!(!t.reload());
        std::fs::remove_file(&path).unwrap();
        assert!(!t.reload());
        assert_eq!(t.header().to_str().unwrap(), "Bearer first-token");
        std::fs::write(&path, "second-token\r\n").unwrap();
        assert!(t.reload());
        assert_eq!(t.header().to_str().unwrap(), "Bearer second-token");
        assert!(t.header().is_sensitive(), "never printed by tonic's Debug");
    }

    #[test]
    fn a_missing_empty_or_invalid_token_is_refused_at_build() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(TokenSource::file(&dir.path().join("none")), Err(TokenProblem::Unreadable(_))));
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        assert!(matches!(TokenSource::file(&empty), Err(TokenProblem::Invalid)));
        assert!(matches!(TokenSource::fixed("a\nb"), Err(TokenProblem::Invalid)));
        let mut fixed = TokenSource::fixed("given").unwrap();
        assert!(!fixed.reload(), "a token given as a string never changes");
    }
}
