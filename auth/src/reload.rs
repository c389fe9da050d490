//! Serving mutual TLS with certificates that can be rotated without a restart.
//!
//! [`ServerTls`] holds the rustls settings built from a [`TlsFiles`] (this server's certificate and key, and the CA
//! that signs its callers') and rebuilds them when [`ServerTls::reload`] is called: on `SIGHUP` and whenever one of
//! the three files changes ([`ServerTls::watch`]). New connections get the new certificate at once; open ones keep
//! theirs until they close. A reload that fails (a half-written file, a key that does not match its certificate)
//! keeps the settings that work and says why.
//!
//! [`incoming`] turns a TCP listener into the TLS connections tonic serves: the handshake runs per connection, bounded
//! in time, so a slow or silent client holds up nobody else. Peer certificates reach handlers as with tonic's own TLS
//! (`Request::peer_certs`), which is what [`crate::Auth`] reads.

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_stream::Stream;

use crate::{AuthError, TlsFiles};

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often [`ServerTls::watch`] looks at the files' modification times.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// A server's TLS settings, rebuilt from its files on demand.
#[derive(Debug)]
pub struct ServerTls {
    files: TlsFiles,
    current: RwLock<Arc<rustls::ServerConfig>>,
    stamps: RwLock<Vec<Option<SystemTime>>>,
    reloads: AtomicU64,
}

fn file_error(path: &std::path::Path, message: impl std::fmt::Display) -> AuthError {
    AuthError::File { path: path.to_path_buf(), message: message.to_string() }
}

/// Builds rustls server settings from `files`: present the certificate, require a client certificate the CA signed.
pub fn server_config(files: &TlsFiles) -> Result<rustls::ServerConfig, AuthError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| file_error(&files.cert, format!("cannot read: {e}")))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(&files.cert, format!("not a PEM certificate: {e}")))?;
    if certs.is_empty() {
        return Err(file_error(&files.cert, "no PEM certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| file_error(&files.key, format!("{e}")))?;
    let mut roots = rustls::RootCertStore::empty();
    let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.ca)
        .map_err(|e| file_error(&files.ca, format!("cannot read: {e}")))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(&files.ca, format!("not a PEM certificate: {e}")))?;
    for ca in cas {
        roots.add(ca).map_err(|e| file_error(&files.ca, format!("not a CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(file_error(&files.ca, "no PEM certificate in the file"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| file_error(&files.ca, format!("cannot verify clients with it: {e}")))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| AuthError::Generate(format!("TLS versions: {e}")))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| file_error(&files.key, format!("does not go with {}: {e}", files.cert.display())))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

impl TlsFiles {
    /// The modification times of the certificate, key and CA files (`None` for a file that cannot be read): when
    /// they change, the files were rewritten and are worth loading again.
    pub fn stamps(&self) -> Vec<Option<SystemTime>> {
        [&self.cert, &self.key, &self.ca]
            .into_iter()
            .map(|p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .collect()
    }
}

impl ServerTls {
    /// Reads `files` now: an error names the file at fault.
    pub fn new(files: TlsFiles) -> Result<Arc<ServerTls>, AuthError> {
        let stamps = files.stamps();
        let config = server_config(&files)?;
        Ok(Arc::new(ServerTls {
            files,
            current: RwLock::new(Arc::new(config)),
            stamps: RwLock::new(stamps),
            reloads: AtomicU64::new(0),
        }))
    }

    /// The files it reads.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The settings new connections get.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Successful reloads so far.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::SeqCst)
    }

    /// Reads the files again and, if they make valid settings, serves them to new connections. On an error the
    /// settings in use stay.
    pub fn reload(&self) -> Result<(), AuthError> {
        let stamps = self.files.stamps();
        let config = server_config(&self.files)?;
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config);
        *self.stamps.write().unwrap_or_else(std::sync::PoisonError::into_inner) = stamps;
        self.reloads.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Whether a file's modification time differs from when it was last read.
    pub fn changed(&self) -> bool {
        *self.stamps.read().unwrap_or_else(std::sync::PoisonError::into_inner) != self.files.stamps()
    }

    /// Reloads on `SIGHUP` and when the files change, calling `on_reload` after each successful reload, until the
    /// returned task is aborted.
    pub fn watch(self: &Arc<Self>, on_reload: impl Fn() + Send + Sync + 'static) -> tokio::task::JoinHandle<()> {
        let tls = Arc::clone(self);
        tokio::spawn(async move {
            #[cfg(unix)]
            let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            let mut tick = tokio::time::interval(WATCH_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                #[cfg(unix)]
                let why = tokio::select! {
                    Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => None } } => "SIGHUP",
                    _ = tick.tick() => "a changed file",
                };
                #[cfg(not(unix))]
                let why = {
                    tick.tick().await;
                    "a changed file"
                };
                if why != "SIGHUP" && !tls.changed() {
                    continue;
                }
                match tls.reload() {
                    Ok(()) => {
                        tracing::info!(cert = %tls.files.cert.display(), "TLS certificates reloaded on {why}");
                        on_reload();
                    }
                    Err(e) => tracing::error!("TLS certificates not reloaded on {why}, keeping those in use: {e}"),
                }
            }
        })
    }
}

/// The TLS connections accepted on `listener` with `tls`'s settings at the time of each connection, for tonic's
/// `serve_with_incoming`. Failed handshakes are logged and dropped. Accepting stops when the stream is dropped.
pub fn incoming(listener: TcpListener, tls: Arc<ServerTls>) -> Incoming {
    let (tx, rx) = mpsc::channel(64);
    let accept = tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
            let out = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = out.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake not finished within {HANDSHAKE_TIMEOUT:?}"),
                }
            });
            if tx.is_closed() {
                return;
            }
        }
    });
    Incoming { rx, accept }
}

/// See [`incoming`].
#[derive(Debug)]
pub struct Incoming {
    rx: mpsc::Receiver<io::Result<TlsStream<TcpStream>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Stream for Incoming {
    type Item = io::Result<TlsStream<TcpStream>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{COORDINATOR_SERVER_NAME, Identity, init_pki};

    fn files(dir: &std::path::Path, name: &str) -> TlsFiles {
        TlsFiles { cert: dir.join(format!("{name}.pem")), key: dir.join(format!("{name}.key")), ca: dir.join("ca.pem") }
    }

    /// Connects as `client` and returns the name on the server's certificate.
    async fn server_name(addr: std::net::SocketAddr, client: &TlsFiles) -> String {
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(&client.ca).unwrap() {
            roots.add(ca.unwrap()).unwrap();
        }
        let certs: Vec<_> = CertificateDer::pem_file_iter(&client.cert).unwrap().map(Result::unwrap).collect();
        let key = PrivateKeyDer::from_pem_file(&client.key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .unwrap();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from(COORDINATOR_SERVER_NAME).unwrap();
        let stream = connector.connect(name, tcp).await.unwrap();
        let der = stream.get_ref().1.peer_certificates().unwrap()[0].clone();
        Identity::from_der(&der).unwrap().name
    }

    #[tokio::test]
    async fn new_connections_get_the_reloaded_certificate_and_a_bad_one_is_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        init_pki(dir.path(), 2, &[], &[]).unwrap();
        // The server reads its own copy of node-1's files, which are then replaced by node-2's.
        let served = tempfile::tempdir().unwrap();
        let own = files(served.path(), "server");
        let copy = |from: &str| {
            std::fs::copy(dir.path().join(format!("{from}.pem")), &own.cert).unwrap();
            std::fs::copy(dir.path().join(format!("{from}.key")), &own.key).unwrap();
        };
        copy("node-1");
        std::fs::copy(dir.path().join("ca.pem"), &own.ca).unwrap();
        let tls = ServerTls::new(own.clone()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = incoming(listener, tls.clone());
        let server = tokio::spawn(async move {
            use tokio_stream::StreamExt;
            // Hold the accepted connections open until the test ends.
            let mut open = Vec::new();
            while let Some(c) = incoming.next().await {
                open.push(c.unwrap());
            }
        });
        let reader = files(dir.path(), "reader");
        assert_eq!(server_name(addr, &reader).await, "node-1");
        assert!(!tls.changed());

        copy("node-2");
        // Modification times may not move within the filesystem's resolution: the reload is what counts here.
        tls.reload().unwrap();
        assert_eq!(tls.reloads(), 1);
        assert_eq!(server_name(addr, &reader).await, "node-2");

        // A key that does not parse: the reload fails naming the file, and the certificate in use stays.
        std::fs::write(&own.key, "not a key").unwrap();
        let e = tls.reload().unwrap_err().to_string();
        assert!(e.contains("server.key"), "{e}");
        assert_eq!(server_name(addr, &reader).await, "node-2");
        assert!(tls.changed() || tls.reloads() == 1);
        server.abort();
    }
}
