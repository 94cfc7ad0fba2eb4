//! TLS on both listeners, with certificates made at test time (rcgen): HTTPS answers with
//! the configured certificate and picks up a renewed one without a restart; an agent that
//! verifies the server against the configured CA syncs over TLS, one with another CA does
//! not, and an `https://` address without a CA is refused at build time.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use levee_agent::{Agent, BuildError};
use levee_server::Server;
use levee_server::config::{Secret, Settings};
use levee_server::tls::TlsFiles;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{ADMIN_PASSWORD, JWT_SECRET};
use crate::support::fast_sync;

pub(crate) struct Ca {
    pub(crate) pem: String,
    issuer: Issuer<'static, KeyPair>,
}

pub(crate) fn new_ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    Ca { pem: cert.pem(), issuer: Issuer::new(params, key) }
}

/// Writes a leaf for `localhost` signed by `ca`, with `cn` as its common name.
pub(crate) fn write_leaf(ca: &Ca, cn: &str, files: &TlsFiles) -> CertificateDer<'static> {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    // Key first, then the certificate: a reader never sees a new cert with the old key
    // for long (and a mismatch is refused, keeping the old pair).
    let tmp_key = files.key.with_extension("tmp");
    std::fs::write(&tmp_key, key.serialize_pem()).unwrap();
    std::fs::rename(&tmp_key, &files.key).unwrap();
    let tmp_cert = files.cert.with_extension("tmp");
    std::fs::write(&tmp_cert, cert.pem()).unwrap();
    std::fs::rename(&tmp_cert, &files.cert).unwrap();
    cert.der().clone()
}

pub(crate) fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    // Every connection a full handshake: a resumed session shows the old certificate.
    cfg.resumption = rustls::client::Resumption::disabled();
    Arc::new(cfg)
}

/// One HTTP/1.1 request over TLS; returns the status line's code, the body and the
/// certificate the server presented.
async fn https(
    cfg: &Arc<rustls::ClientConfig>,
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&serde_json::Value>,
) -> (u16, String, CertificateDer<'static>) {
    let (text, presented) = https_raw(cfg, addr, method, path, token, body, &[]).await;
    let code = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (code, body, presented)
}

/// [`https`]'s whole response as text (status line, headers, body), with more request
/// `headers`.
pub(crate) async fn https_raw(
    cfg: &Arc<rustls::ClientConfig>,
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&serde_json::Value>,
    headers: &[(&str, &str)],
) -> (String, CertificateDer<'static>) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(cfg.clone());
    let mut tls =
        connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await.expect("TLS handshake");
    let presented = tls.get_ref().1.peer_certificates().unwrap()[0].clone().into_owned();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut auth = token.map(|t| format!("authorization: Bearer {t}\r\n")).unwrap_or_default();
    for (k, v) in headers {
        auth.push_str(&format!("{k}: {v}\r\n"));
    }
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    (String::from_utf8_lossy(&out).into_owned(), presented)
}

/// The body of a response that may be chunked: the JSON object inside it.
pub(crate) fn json_of(body: &str) -> serde_json::Value {
    let start = body.find('{').unwrap();
    let end = body.rfind('}').unwrap();
    serde_json::from_str(&body[start..=end]).unwrap()
}

async fn tls_server(dir: &Path, files: &TlsFiles) -> Server {
    let mut settings = Settings::for_dir(dir);
    settings.admin_password = Some(Secret::new(ADMIN_PASSWORD));
    settings.jwt_secret = Some(Secret::new(JWT_SECRET));
    settings.tls = Some(files.clone());
    Server::start(settings, None).await.expect("server starts with TLS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_both_listeners_serve_tls_reload_renewed_certificates_and_agents_verify_the_ca() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let files = TlsFiles { cert: dir.path().join("tls.crt"), key: dir.path().join("tls.key") };
    let ca = new_ca("levee test CA");
    let first = write_leaf(&ca, "levee-1", &files);
    let server = tls_server(&dir.path().join("data"), &files).await;
    let cfg = client_config(&ca.pem);

    let (code, body, presented) = https(&cfg, server.http_addr, "GET", "/healthz", None, None).await;
    assert_eq!((code, body.trim()), (200, "ok"));
    assert_eq!(presented, first);
    // Plain HTTP on the TLS port gets nothing useful.
    let mut plain = tokio::net::TcpStream::connect(server.http_addr).await.unwrap();
    plain.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut buf)).await;
    assert!(!String::from_utf8_lossy(&buf).contains("200 OK"));

    // The API over HTTPS: log in, create what the agent needs, mint its token.
    let login = serde_json::json!({"username": "admin", "password": ADMIN_PASSWORD});
    let (code, body, _) =
        https(&cfg, server.http_addr, "POST", "/api/v1/auth/login", None, Some(&login)).await;
    assert_eq!(code, 200, "{body}");
    let admin = json_of(&body)["token"].as_str().unwrap().to_string();
    let calls = [
        ("/api/v1/environments", serde_json::json!({"name": "prod", "reason": "tls"})),
        (
            "/api/v1/environments/prod/services",
            serde_json::json!({"name": "checkout", "reason": "tls", "policy": {"dependencies": {}}}),
        ),
        (
            "/api/v1/tokens",
            serde_json::json!({"kind": "agent", "name": "tls", "environment": "prod", "services": ["checkout"], "reason": "tls"}),
        ),
    ];
    let mut agent_token = String::new();
    for (path, body) in calls {
        let (code, text, _) = https(&cfg, server.http_addr, "POST", path, Some(&admin), Some(&body)).await;
        assert_eq!(code, 201, "{path}: {text}");
        if path.ends_with("tokens") {
            agent_token = json_of(&text)["token"].as_str().unwrap().to_string();
        }
    }

    // An agent verifying against the CA syncs over TLS.
    let grpc = format!("https://localhost:{}", server.grpc_addr.port());
    let cache = tempfile::tempdir().unwrap();
    let agent = Agent::builder(&grpc, &agent_token, "prod", "checkout")
        .cache_dir(cache.path())
        .tls_ca_pem(ca.pem.clone())
        .sync_settings(fast_sync())
        .build()
        .unwrap();
    agent.wait_for_initial_sync(Duration::from_secs(10)).await.expect("synced over TLS");
    assert_eq!(agent.status().revision, 1);

    // One trusting another CA never syncs; https without a CA is refused at build time.
    let other = new_ca("someone else's CA");
    let stranger = Agent::builder(&grpc, &agent_token, "prod", "checkout")
        .tls_ca_pem(other.pem.clone())
        .sync_settings(fast_sync())
        .build()
        .unwrap();
    assert!(stranger.wait_for_initial_sync(Duration::from_millis(1500)).await.is_err());
    assert!(
        stranger.status().last_error.is_some_and(|e| e.contains("cannot connect")),
        "{:?}",
        stranger.status()
    );
    let err = Agent::builder(&grpc, &agent_token, "prod", "checkout").build().expect_err("refused");
    assert!(matches!(err, BuildError::TlsMismatch { .. }), "{err}");

    // A renewed certificate is served without a restart.
    let second = write_leaf(&ca, "levee-2", &files);
    assert_ne!(first, second);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (_, _, presented) = https(&cfg, server.http_addr, "GET", "/healthz", None, None).await;
        if presented == second {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the renewed certificate was not picked up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(agent);
    drop(stranger);
    server.shutdown().await;
}

/// Levee terminating TLS itself, an HTTP/1.1 request (whose URI carries no scheme): the
/// cookies it sets are `Secure`; over plain HTTP they are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookies_are_secure_over_levees_own_tls_on_http_1_1() {
    let dir = tempfile::tempdir().unwrap();
    let ca = new_ca("levee test CA");
    let files = TlsFiles { cert: dir.path().join("cert.pem"), key: dir.path().join("key.pem") };
    write_leaf(&ca, "first", &files);
    let server = tls_server(dir.path(), &files).await;
    let (text, _) =
        https_raw(&client_config(&ca.pem), server.http_addr, "GET", "/login", None, None, &[]).await;
    let head = text.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let cookie =
        head.lines().find(|l| l.starts_with("set-cookie: levee_login=")).expect("the login nonce cookie");
    assert!(cookie.contains("; secure"), "{cookie}");
    server.shutdown().await;

    let plain_dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::for_dir(plain_dir.path());
    settings.admin_password = Some(Secret::new(ADMIN_PASSWORD));
    settings.jwt_secret = Some(Secret::new(JWT_SECRET));
    let plain = Server::start(settings, None).await.unwrap();
    let res = reqwest::get(format!("http://{}/login", plain.http_addr)).await.unwrap();
    let cookie = res.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(cookie.starts_with("levee_login=") && !cookie.contains("Secure"), "{cookie}");
    plain.shutdown().await;
}
