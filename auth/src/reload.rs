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
//! (`Request::peer_certs`), which is what [`crate::Auth`] reads. A handshake whose client certificate the server's
//! revocation list names fails with the `certificate_revoked` alert ([`ServerTls::set_revoked`]), and one identity
//! holds at most [`MAX_CONNECTIONS_PER_IDENTITY`] connections at once ([`Admission`], [`incoming_admitted`]).

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use rustls::DigitallySignedStruct;
use rustls::DistinguishedName;
use rustls::SignatureScheme;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::UnixTime;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_stream::Stream;

use crate::{AuthError, Identity, OnRefusal, TlsFiles};

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
    revoked: Arc<RevocationHook>,
}

fn file_error(path: &std::path::Path, message: impl std::fmt::Display) -> AuthError {
    AuthError::File { path: path.to_path_buf(), message: message.to_string() }
}

/// Builds rustls server settings from `files`: present the certificate, require a client certificate the CA signed.
pub fn server_config(files: &TlsFiles) -> Result<rustls::ServerConfig, AuthError> {
    server_config_with(files, Arc::default())
}

/// Asked on every handshake with the client certificate's serial (as [`crate::normalize_serial`] writes it): whether
/// that certificate was revoked.
pub type Revoked = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Where a server's handshakes find the revocation list: set once the list exists ([`ServerTls::set_revoked`]).
#[derive(Default)]
pub struct RevocationHook(RwLock<Option<Revoked>>);

impl std::fmt::Debug for RevocationHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RevocationHook").field(&self.get().is_some()).finish()
    }
}

impl RevocationHook {
    fn get(&self) -> Option<Revoked> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// The CA's client verifier, and then the revocation list: a revoked certificate fails its handshake with the
/// `certificate_revoked` alert, before any request is read.
#[derive(Debug)]
struct RevocationAware {
    inner: Arc<dyn ClientCertVerifier>,
    hook: Arc<RevocationHook>,
}

impl ClientCertVerifier for RevocationAware {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        if let Some(revoked) = self.hook.get() {
            let serial = crate::serial_of(end_entity)
                .ok_or(rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
            if revoked(&serial) {
                tracing::info!(serial, "TLS handshake refused: the client's certificate was revoked");
                return Err(rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked));
            }
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// [`server_config`], whose handshakes also refuse the certificates `hook` says are revoked.
fn server_config_with(files: &TlsFiles, hook: Arc<RevocationHook>) -> Result<rustls::ServerConfig, AuthError> {
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
        .with_client_cert_verifier(Arc::new(RevocationAware { inner: verifier, hook }))
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
        let revoked = Arc::<RevocationHook>::default();
        let config = server_config_with(&files, Arc::clone(&revoked))?;
        Ok(Arc::new(ServerTls {
            files,
            current: RwLock::new(Arc::new(config)),
            stamps: RwLock::new(stamps),
            reloads: AtomicU64::new(0),
            revoked,
        }))
    }

    /// Refuses, from now on, every handshake whose client certificate `revoked` names (by serial), in the settings
    /// in use and every reload's.
    pub fn set_revoked(&self, revoked: Revoked) {
        *self.revoked.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(revoked);
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
        let config = server_config_with(&self.files, Arc::clone(&self.revoked))?;
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

/// The most TLS connections one identity (a certificate's role and name) may hold open to one server at once
/// ([`Admission::max_per_identity`]'s default). A client needs one, a coordinator member one per peer and agent;
/// beyond this, a holder of one certificate could otherwise exhaust the server's file descriptors alone.
pub const MAX_CONNECTIONS_PER_IDENTITY: usize = 64;

/// Who keeps a connection once its TLS handshake is done (revoked certificates never finish one:
/// [`ServerTls::set_revoked`]).
#[derive(Clone)]
pub struct Admission {
    /// Connections one identity may hold open at once; the next is closed after its handshake.
    pub max_per_identity: usize,
    /// Called with the kind of each refused connection (`connection_limit`) and why.
    pub on_refusal: Option<OnRefusal>,
}

impl Default for Admission {
    fn default() -> Admission {
        Admission { max_per_identity: MAX_CONNECTIONS_PER_IDENTITY, on_refusal: None }
    }
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").field("max_per_identity", &self.max_per_identity).finish()
    }
}

/// Open connections per identity, shared by a server's accept loop and its [`Admitted`] connections.
type OpenCounts = Arc<Mutex<HashMap<String, usize>>>;

impl Admission {
    /// Admits the connection whose client presented `certs`, or says why not (kind, reason). An admitted one holds
    /// a place in `open` until it is dropped.
    fn admit(
        &self,
        certs: Option<&[CertificateDer<'static>]>,
        open: &OpenCounts,
    ) -> Result<Option<Place>, (&'static str, String)> {
        // The verifier already required a certificate the CA signed; without one (never, under mutual TLS) the
        // calls are refused one by one.
        let Some(leaf) = certs.and_then(|c| c.first()) else { return Ok(None) };
        // A certificate without a role is refused by every call; it counts under its serial here.
        let key = match Identity::from_der(leaf) {
            Ok(who) => format!("{}/{}", who.role.name(), who.name),
            Err(_) => format!("serial/{}", crate::serial_of(leaf).unwrap_or_default()),
        };
        let mut counts = open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = counts.entry(key.clone()).or_default();
        if *n >= self.max_per_identity {
            return Err((
                "connection_limit",
                format!("{key} holds {} connections already, the most one identity may", self.max_per_identity),
            ));
        }
        *n += 1;
        Ok(Some(Place { key, open: Arc::clone(open) }))
    }
}

/// An admitted connection's place in its identity's count, given back when the connection is dropped.
#[derive(Debug)]
struct Place {
    key: String,
    open: OpenCounts,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut counts = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = counts.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// A TLS connection that passed [`Admission`]: it reads, writes and tells tonic its peer certificates as the TLS
/// stream it wraps, and gives back its identity's place when dropped.
#[derive(Debug)]
pub struct Admitted {
    stream: TlsStream<TcpStream>,
    _place: Option<Place>,
}

impl Admitted {
    /// The TLS stream.
    pub fn get_ref(&self) -> &TlsStream<TcpStream> {
        &self.stream
    }
}

impl tokio::io::AsyncRead for Admitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Admitted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Admitted {
    type ConnectInfo = <TlsStream<TcpStream> as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

/// The TLS connections accepted on `listener` with `tls`'s settings at the time of each connection, for tonic's
/// `serve_with_incoming`, at most [`MAX_CONNECTIONS_PER_IDENTITY`] per identity. Failed handshakes are logged and
/// dropped. Accepting stops when the stream is dropped.
pub fn incoming(listener: TcpListener, tls: Arc<ServerTls>) -> Incoming {
    incoming_admitted(listener, tls, Admission::default())
}

/// [`incoming`], keeping only the connections `admission` admits.
pub fn incoming_admitted(listener: TcpListener, tls: Arc<ServerTls>, admission: Admission) -> Incoming {
    let (tx, rx) = mpsc::channel(64);
    let open: OpenCounts = Arc::default();
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
            let (admission, open) = (admission.clone(), Arc::clone(&open));
            tokio::spawn(async move {
                let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => return tracing::debug!(%peer, "TLS handshake failed: {e}"),
                    Err(_) => return tracing::debug!(%peer, "TLS handshake not finished within {HANDSHAKE_TIMEOUT:?}"),
                };
                match admission.admit(stream.get_ref().1.peer_certificates(), &open) {
                    Ok(place) => {
                        let _ = out.send(Ok(Admitted { stream, _place: place })).await;
                    }
                    Err((kind, why)) => {
                        tracing::info!(%peer, "connection closed after its TLS handshake: {why}");
                        if let Some(f) = &admission.on_refusal {
                            f(kind, &why);
                        }
                    }
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
    rx: mpsc::Receiver<io::Result<Admitted>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Stream for Incoming {
    type Item = io::Result<Admitted>;

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

    /// A TLS connection to `addr` as `client`, handshake done (or what it failed with).
    async fn connect(
        addr: std::net::SocketAddr,
        client: &TlsFiles,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
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
        connector.connect(name, tcp).await.map_err(|e| format!("{e:?}"))
    }

    /// Connects as `client` and returns the name on the server's certificate.
    async fn server_name(addr: std::net::SocketAddr, client: &TlsFiles) -> String {
        let stream = connect(addr, client).await.unwrap();
        let der = stream.get_ref().1.peer_certificates().unwrap()[0].clone();
        Identity::from_der(&der).unwrap().name
    }

    /// Connects as `client` and says whether the server keeps the connection: it reads until the server closes it
    /// (`Err`, with what the read or the handshake said) or `kept` reports it (the connection, open).
    async fn kept_open(
        addr: std::net::SocketAddr,
        client: &TlsFiles,
        kept: &mut mpsc::Receiver<String>,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
        use tokio::io::AsyncReadExt;
        let mut stream = connect(addr, client).await?;
        let mut byte = [0u8; 1];
        tokio::select! {
            who = kept.recv() => {
                assert_eq!(who.as_deref(), Some(Identity::from_pem_file(&client.cert).unwrap().name.as_str()));
                Ok(stream)
            }
            // The server sends nothing on a connection it keeps: a read ends only when it closes the connection.
            r = stream.read(&mut byte) => {
                assert!(!matches!(r, Ok(n) if n > 0), "{r:?}");
                Err(format!("{r:?}"))
            }
        }
    }

    /// A revoked certificate fails its handshake (`certificate_revoked`), and an identity holds at most
    /// `max_per_identity` connections at once, a place coming back when one of them closes; refusals are counted.
    #[tokio::test]
    async fn revoked_certificates_fail_their_handshake_and_connections_are_limited_per_identity() {
        let dir = tempfile::tempdir().unwrap();
        init_pki(dir.path(), 2, &[], &[], crate::CERT_LIFETIME_DAYS).unwrap();
        let tls = ServerTls::new(files(dir.path(), "node-1")).unwrap();
        let reader = files(dir.path(), "reader");
        let member = files(dir.path(), "node-2");
        let revoked = Identity::from_pem_file(&reader.cert).unwrap().serial;
        tls.set_revoked(Arc::new(move |serial| serial == revoked));
        let refusals: Arc<Mutex<Vec<String>>> = Arc::default();
        let counted = Arc::clone(&refusals);
        let admission = Admission {
            max_per_identity: 2,
            on_refusal: Some(Arc::new(move |kind, _| counted.lock().unwrap().push(kind.to_string()))),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = incoming_admitted(listener, tls, admission);
        let (kept_tx, mut kept) = mpsc::channel(8);
        let (drop_tx, mut drop_rx) = mpsc::channel::<()>(1);
        let server = tokio::spawn(async move {
            use tokio_stream::StreamExt;
            // Holds the admitted connections open, and drops them all when asked.
            let mut open = Vec::new();
            loop {
                tokio::select! {
                    Some(c) = incoming.next() => {
                        let c = c.unwrap();
                        let der = c.get_ref().get_ref().1.peer_certificates().unwrap()[0].clone();
                        open.push(c);
                        kept_tx.send(Identity::from_der(&der).unwrap().name).await.unwrap();
                    }
                    Some(()) = drop_rx.recv() => open.clear(),
                }
            }
        });
        let e = kept_open(addr, &reader, &mut kept).await.unwrap_err();
        assert!(e.contains("CertificateRevoked"), "a revoked certificate fails its handshake: {e}");
        let first = kept_open(addr, &member, &mut kept).await.expect("a member's first connection");
        let second = kept_open(addr, &member, &mut kept).await.expect("its second");
        assert!(kept_open(addr, &member, &mut kept).await.is_err(), "a third is over the limit");
        assert_eq!(*refusals.lock().unwrap(), ["connection_limit"]);
        drop((first, second));
        drop_tx.send(()).await.unwrap();
        // Once the server has dropped them, their places are free again (the server drops them when asked; the
        // next connection is admitted as soon as it has).
        let mut again = None;
        for _ in 0..100 {
            again = kept_open(addr, &member, &mut kept).await.ok();
            if again.is_some() {
                break;
            }
        }
        assert!(again.is_some(), "a place comes back when a connection closes");
        server.abort();
    }

    #[tokio::test]
    async fn new_connections_get_the_reloaded_certificate_and_a_bad_one_is_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        init_pki(dir.path(), 2, &[], &[], crate::CERT_LIFETIME_DAYS).unwrap();
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
