//! Where the CLI finds its server and token, and the HTTP client that talks to the API.
//!
//! The server URL comes from `--server`, else `LEVEE_SERVER`, else the credentials file
//! `levee login` wrote, else `http://127.0.0.1:8080`. The token comes from `LEVEE_TOKEN`,
//! else that file. The file (`--credentials`, else `LEVEE_CREDENTIALS`, else
//! `$XDG_CONFIG_HOME/levee/credentials.toml`, else `~/.config/levee/credentials.toml`) is
//! written with mode 0600 in a 0700 directory, and a token file others can read is
//! reported.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The server when nothing names one: the default address of `levee serve`.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

/// How long one request may take before the CLI gives up.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What `levee login` keeps.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    /// The server the token is for.
    pub server: Option<String>,
    /// The bearer token (a session token from `levee login`, or an API token).
    pub token: Option<String>,
}

/// The credentials file to use: `explicit` (flag or `LEVEE_CREDENTIALS`), else the
/// per-user configuration directory.
///
/// # Errors
/// When neither `XDG_CONFIG_HOME` nor `HOME` says where that directory is.
pub fn credentials_path(explicit: Option<&Path>) -> Result<PathBuf, CliError> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(home) => PathBuf::from(home).join(".config"),
            None => {
                return Err(CliError::Usage(
                    "no HOME or XDG_CONFIG_HOME: set LEVEE_CREDENTIALS to the file for the token".into(),
                ));
            }
        },
    };
    Ok(base.join("levee").join("credentials.toml"))
}

impl Credentials {
    /// Reads the file; a missing file is empty credentials.
    ///
    /// # Errors
    /// An unreadable or malformed file, named.
    pub fn load(path: &Path) -> Result<Credentials, CliError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Credentials::default()),
            Err(e) => return Err(CliError::Usage(format!("cannot read {}: {e}", path.display()))),
        };
        warn_if_shared(path);
        toml::from_str(&text).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))
    }

    /// Writes the file with mode 0600 (its directory 0700), replacing it atomically.
    ///
    /// # Errors
    /// The file system's, with the path.
    pub fn save(&self, path: &Path) -> Result<(), CliError> {
        let text = toml::to_string(self).map_err(|e| CliError::Usage(e.to_string()))?;
        write_private(path, text.as_bytes())
    }
}

/// Writes a file that holds a secret: mode 0600 (its directory, when created, 0700),
/// replaced atomically (written beside it, then renamed), so a reader — an agent watching
/// its token file — never sees half of it.
///
/// # Errors
/// The file system's, with the path.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let err = |e: std::io::Error| CliError::Usage(format!("cannot write {}: {e}", path.display()));
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(err)?;
    let tmp = dir.join(format!(".{}.tmp-{}", file_name(path), std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let _ = std::fs::remove_file(&tmp);
    let mut f = options.open(&tmp).map_err(err)?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(err)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(err)?;
    Ok(())
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(|| "credentials".into(), |n| n.to_string_lossy().into_owned())
}

/// Says on stderr when the token file can be read by other users.
fn warn_if_shared(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path) {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                eprintln!(
                    "warning: {} holds a token and other users can read it (mode {mode:o}); run: chmod 600 {}",
                    path.display(),
                    path.display()
                );
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// Why a command failed. Every variant is printed as one or more lines on stderr, and the
/// command exits with 1.
#[derive(Debug)]
pub enum CliError {
    /// Bad arguments or local files (with the file named).
    Usage(String),
    /// The server could not be reached.
    Unreachable { server: String, cause: String },
    /// The server answered an error (problem+json, RFC 9457).
    Api {
        /// What was asked.
        what: String,
        status: StatusCode,
        /// The problem's `detail`.
        detail: String,
        /// Its `errors`: path, value and message of every bad field.
        errors: Vec<FieldProblem>,
        /// On a 409: the revision the service is at now.
        current_revision: Option<u64>,
    },
}

/// One bad field of a problem answer.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct FieldProblem {
    pub path: String,
    pub value: String,
    pub message: String,
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m) => f.write_str(m),
            CliError::Unreachable { server, cause } => {
                write!(f, "cannot reach the Levee server at {server}: {cause}")
            }
            CliError::Api { what, status, detail, .. } => write!(f, "{what}: {status}: {detail}"),
        }
    }
}

/// A client of one server's API, authenticated with a bearer token. Every request says
/// `x-levee-client: cli`, so the audit log records `via: cli`.
#[derive(Clone, Debug)]
pub struct Api {
    http: reqwest::Client,
    /// Base URL without a trailing slash.
    pub server: String,
    token: Option<String>,
    /// Break-glass reason sent with every write (`x-levee-break-glass`), if any.
    break_glass: Option<reqwest::header::HeaderValue>,
}

impl Api {
    /// A client of `server`, with `token` when there is one.
    ///
    /// # Errors
    /// A server that is not an http(s) URL.
    pub fn new(server: &str, token: Option<String>) -> Result<Api, CliError> {
        let server = server.trim().trim_end_matches('/').to_string();
        if !(server.starts_with("http://") || server.starts_with("https://")) {
            return Err(CliError::Usage(format!(
                "--server {server:?} must be a URL such as {DEFAULT_SERVER}"
            )));
        }
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("levee-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| CliError::Usage(format!("cannot build an HTTP client: {e}")))?;
        Ok(Api { http, server, token, break_glass: None })
    }

    /// Writes made with this client break the glass with `reason`: where the environment
    /// requires approval for their kind of change, they apply at once, audited as a bypass
    /// (`approval.bypass`) with the reason. `None` changes nothing.
    ///
    /// # Errors
    /// [`CliError::Usage`] when the reason is blank or not plain printable ASCII (it
    /// travels in an HTTP header).
    pub fn break_glass(mut self, reason: Option<&str>) -> Result<Api, CliError> {
        let Some(reason) = reason else { return Ok(self) };
        let reason = reason.trim();
        let bad = || {
            CliError::Usage(
                "--break-glass needs a reason in plain printable ASCII (it is sent in an HTTP header)".into(),
            )
        };
        if reason.is_empty() || !reason.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(bad());
        }
        self.break_glass = Some(reqwest::header::HeaderValue::from_str(reason).map_err(|_| bad())?);
        Ok(self)
    }

    /// Sends `method` to `/api/v1{path}` with an optional JSON body and `If-Match`;
    /// returns the decoded answer (`Value::Null` for an empty one).
    ///
    /// # Errors
    /// [`CliError::Unreachable`] or [`CliError::Api`] with the problem's details.
    pub async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<u64>,
    ) -> Result<T, CliError> {
        let what = format!("{method} {path}");
        let write = method != Method::GET;
        let mut req = self
            .http
            .request(method, format!("{}/api/v1{path}", self.server))
            .header("x-levee-client", "cli");
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(why) = self.break_glass.as_ref().filter(|_| write) {
            req = req.header("x-levee-break-glass", why.clone());
        }
        if let Some(rev) = if_match {
            req = req.header(reqwest::header::IF_MATCH, format!("\"{rev}\""));
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req.send().await.map_err(|e| CliError::Unreachable {
            server: self.server.clone(),
            cause: levee_agent::report::ErrorChain(&e).to_string(),
        })?;
        let status = res.status();
        let bytes = res.bytes().await.map_err(|e| CliError::Unreachable {
            server: self.server.clone(),
            cause: levee_agent::report::ErrorChain(&e).to_string(),
        })?;
        if !status.is_success() {
            #[derive(Default, Deserialize)]
            #[serde(default)]
            struct Problem {
                detail: String,
                errors: Vec<FieldProblem>,
                current_revision: Option<u64>,
            }
            let p: Problem = serde_json::from_slice(&bytes).unwrap_or_else(|_| Problem {
                detail: String::from_utf8_lossy(&bytes).chars().take(500).collect(),
                ..Problem::default()
            });
            let detail = match (status, &self.token) {
                // The login itself: the hint would send the user back where they are.
                (StatusCode::UNAUTHORIZED, _) if what.contains("/auth/login") => p.detail,
                (StatusCode::UNAUTHORIZED, None) => {
                    format!("{} (run `levee login`, or set LEVEE_TOKEN)", p.detail)
                }
                (StatusCode::UNAUTHORIZED, Some(_)) => {
                    format!(
                        "{} (the token was refused: run `levee login` again, or set LEVEE_TOKEN)",
                        p.detail
                    )
                }
                _ => p.detail,
            };
            return Err(CliError::Api {
                what,
                status,
                detail,
                errors: p.errors,
                current_revision: p.current_revision,
            });
        }
        let text = if bytes.is_empty() { b"null".as_slice() } else { &bytes };
        serde_json::from_slice(text).map_err(|e| {
            CliError::Usage(format!("{what}: the server's answer is not what the CLI expects: {e}"))
        })
    }

    /// `GET /api/v1{path}`.
    ///
    /// # Errors
    /// As [`Api::send`].
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        self.send(Method::GET, path, None, None).await
    }
}

/// One path segment (an environment, service or flag key) escaped for a URL.
pub fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
