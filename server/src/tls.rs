//! TLS on the HTTP and gRPC listeners (rustls with ring): a certificate chain and a private
//! key read from PEM files, reloaded when either file changes, so a renewed certificate
//! (cert-manager, certbot) is served without a restart.
//!
//! [`ReloadingCert`] answers every handshake with the newest good pair; [`watch()`] polls
//! the files' modification times every [`RELOAD_POLL`] and, when they changed, loads the
//! pair again. A pair that does not load (a half-written file, a key that does not match)
//! is logged and the previous one stays in use. [`TlsListener`] accepts TCP connections and
//! runs handshakes off the accept loop (a slow client never holds up the others), handing
//! out only completed TLS streams: it is an [`axum::serve::Listener`] for the HTTP server
//! and a stream of connections for tonic's `serve_with_incoming_shutdown`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How often the certificate and key files are checked for a change.
pub const RELOAD_POLL: Duration = Duration::from_secs(2);
/// Longest a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Completed handshakes waiting for the server to take them.
const ACCEPT_QUEUE: usize = 128;

/// Where the certificate chain and its private key are (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first (PEM).
    pub cert: PathBuf,
    /// Private key of the leaf (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Loads a certificate chain and its key, checking that they belong together.
///
/// # Errors
/// A file that cannot be read, holds no certificate or no key, or a key that does not
/// match the certificate; the message names the file.
pub fn load(files: &TlsFiles) -> anyhow::Result<CertifiedKey> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .with_context(|| format!("reading the TLS certificate {}", files.cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing the TLS certificate {}", files.cert.display()))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in {}", files.cert.display());
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .with_context(|| format!("reading the TLS private key {}", files.key.display()))?;
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(certs, key, &provider).with_context(|| {
        format!("the key {} does not match the certificate {}", files.key.display(), files.cert.display())
    })?;
    Ok(certified)
}

fn stamp(files: &TlsFiles) -> Option<(SystemTime, SystemTime, u64, u64)> {
    let c = std::fs::metadata(&files.cert).ok()?;
    let k = std::fs::metadata(&files.key).ok()?;
    Some((c.modified().ok()?, k.modified().ok()?, c.len(), k.len()))
}

/// The certificate every handshake is answered with, replaced by [`watch()`] when the files
/// change. Cheap to share.
#[derive(Debug)]
pub struct ReloadingCert {
    files: TlsFiles,
    current: ArcSwap<CertifiedKey>,
}

impl ReloadingCert {
    /// Loads the files once.
    ///
    /// # Errors
    /// As [`load`].
    pub fn new(files: TlsFiles) -> anyhow::Result<Arc<ReloadingCert>> {
        let current = ArcSwap::from_pointee(load(&files)?);
        Ok(Arc::new(ReloadingCert { files, current }))
    }

    /// Loads the files again; on failure the current pair stays and the error is returned.
    ///
    /// # Errors
    /// As [`load`].
    pub fn reload(&self) -> anyhow::Result<()> {
        self.current.store(Arc::new(load(&self.files)?));
        Ok(())
    }

    /// A rustls server configuration answering with this certificate and offering `alpn`
    /// (`h2` for gRPC; `h2` and `http/1.1` for HTTP).
    pub fn server_config(self: &Arc<Self>, alpn: &[&[u8]]) -> Arc<ServerConfig> {
        let mut cfg = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(cfg)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// Reloads `cert` whenever its files change, until `shutdown`.
pub async fn watch(cert: Arc<ReloadingCert>, mut shutdown: watch::Receiver<bool>) {
    let mut last = stamp(&cert.files);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(RELOAD_POLL) => {}
            _ = crate::shutdown::stopped(&mut shutdown) => return,
        }
        let now = stamp(&cert.files);
        if now.is_none() || now == last {
            continue;
        }
        match cert.reload() {
            Ok(()) => {
                last = now;
                metrics::counter!("levee_server_tls_reloads_total", "outcome" => "ok").increment(1);
                tracing::info!(cert = %cert.files.cert.display(), "TLS certificate reloaded");
            }
            Err(e) => {
                // Maybe half-written: try again next poll, serving the old pair meanwhile.
                metrics::counter!("levee_server_tls_reloads_total", "outcome" => "error").increment(1);
                tracing::warn!(error = %levee_agent::report::ErrorChain(e.as_ref()), "TLS certificate not reloaded; the previous one stays");
            }
        }
    }
}

/// TCP connections with their TLS handshake done, ready for a server.
#[derive(Debug)]
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `tcp` and runs each handshake on its own task with `config`.
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let (sock, peer) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!(error = %e, "accepting a TCP connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let _ = sock.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(sock)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { rx, local })
    }

    /// The connections as a stream, for tonic.
    pub fn into_stream(self) -> impl futures::Stream<Item = std::io::Result<TlsStream<TcpStream>>> {
        tokio_stream::wrappers::ReceiverStream::new(self.rx).map(|(s, _)| Ok(s))
    }
}

use tokio_stream::StreamExt as _;

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept task never ends while the listener lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// The peer address of a TLS connection, as axum's connect info. Handlers read
/// `ConnectInfo<SocketAddr>` whether or not TLS is on: [`with_socket_addr`] copies it there.
#[derive(Clone, Copy, Debug)]
pub struct PeerAddr(pub SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>> for PeerAddr {
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        PeerAddr(*stream.remote_addr())
    }
}

/// `app` with each request's [`PeerAddr`] also given as `ConnectInfo<SocketAddr>`, as the
/// plain-TCP server gives it.
pub fn with_socket_addr(app: axum::Router) -> axum::Router {
    use axum::extract::ConnectInfo;
    app.layer(axum::middleware::map_request(|mut req: axum::extract::Request| async move {
        if let Some(ConnectInfo(PeerAddr(a))) = req.extensions().get::<ConnectInfo<PeerAddr>>().copied() {
            req.extensions_mut().insert(ConnectInfo(a));
        }
        req
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(dir: &std::path::Path, cn: &str) -> (TlsFiles, Vec<u8>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = params.self_signed(&key).unwrap();
        let files = TlsFiles { cert: dir.join(format!("{cn}.crt")), key: dir.join(format!("{cn}.key")) };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        (files, cert.der().to_vec())
    }

    #[test]
    fn a_pair_that_does_not_load_keeps_the_current_one_and_says_which_file() {
        let dir = tempfile::tempdir().unwrap();
        let (files, der) = pair(dir.path(), "a");
        let cert = ReloadingCert::new(files.clone()).unwrap();
        let pem = std::fs::read(&files.cert).unwrap();
        std::fs::write(&files.cert, "half-written").unwrap();
        let e = cert.reload().unwrap_err();
        assert!(format!("{e:#}").contains("a.crt"), "{e:#}");
        assert_eq!(cert.current.load().cert[0].as_ref(), &der[..]);
        // A key that belongs to another certificate is refused too.
        let (other, _) = pair(dir.path(), "b");
        std::fs::copy(&other.key, &files.key).unwrap();
        std::fs::write(&files.cert, &pem).unwrap();
        assert!(cert.reload().is_err());
        assert_eq!(cert.current.load().cert[0].as_ref(), &der[..]);
        // A good pair replaces it.
        std::fs::copy(&other.cert, &files.cert).unwrap();
        cert.reload().unwrap();
        assert_ne!(cert.current.load().cert[0].as_ref(), &der[..]);
        assert!(load(&TlsFiles { cert: dir.path().join("missing.crt"), key: files.key.clone() }).is_err());
    }
}
