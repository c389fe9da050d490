//! # tessera-auth
//!
//! Who is calling, and what they may do. Tessera's connections are mutual TLS (rustls, through tonic): each side
//! presents a certificate signed by the cluster's CA, and a certificate's subject names its holder. The
//! organizational unit (OU) is the [`Role`] and the common name (CN) the name: `OU=operator, CN=operator`, or
//! `OU=agent, CN=node-a-0` for the agent of node `node-a-0`, or `OU=coordinator, CN=node-2` for coordinator member 2.
//! Nothing a message says about its sender counts; only the certificate does.
//!
//! - [`TlsFiles`]: a certificate, its key and the CA, as server and client TLS settings. A coordinator's certificate
//!   carries the DNS names [`COORDINATOR_SERVER_NAME`] and `node-<id>`; an agent's, its node id. A client checks the
//!   server it reached against those names, so a coordinator reaching peer 2 knows it talks to member 2.
//! - [`Auth`]: the check every RPC makes ([`Auth::check`]): [`Need`] says which role may call it; a refusal is
//!   `UNAUTHENTICATED` (no certificate) or `PERMISSION_DENIED` naming the role needed.
//! - [`init_pki`]: a development PKI in one call (`coordinator certs init`).
//! - [`deadline`]: every unary call answered within a limit, its body read included.
//! - [`reload`]: serving mutual TLS with certificates rotated without a restart (on `SIGHUP` or a changed file).
//!
//! Roles nest: `admin` may do what an `operator` may, and an `operator` what a `reader` may. A `coordinator` is a
//! member of the cluster: peers exchange Raft messages, and a follower forwards calls it has already checked to the
//! leader, so a coordinator identity passes every check but an agent's own-node check.

pub mod deadline;
pub mod reload;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tonic::transport::{Certificate, ClientTlsConfig, Identity as TlsIdentity, ServerTlsConfig};
use tonic::{Request, Status};

pub use reload::{Admission, Admitted, Revoked, ServerTls, incoming, incoming_admitted};

/// The DNS name every coordinator certificate carries; clients that do not know which member they reach (the CLI,
/// agents) check the server against it.
pub const COORDINATOR_SERVER_NAME: &str = "tessera-coordinator";

/// What a certificate's holder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Status, lists, plans, explanations.
    Reader,
    /// A reader that may also change tenants, drain GPUs and trigger plans.
    Operator,
    /// An operator that may also change membership and inject faults.
    Admin,
    /// A node agent: registers, heartbeats and reports for its own node only.
    Agent,
    /// A coordinator member: Raft messages, pushes to agents, calls forwarded to the leader.
    Coordinator,
}

impl Role {
    /// The role's name, as in a certificate's OU.
    pub fn name(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Operator => "operator",
            Role::Admin => "admin",
            Role::Agent => "agent",
            Role::Coordinator => "coordinator",
        }
    }

    /// The role named `s` (as in a certificate's OU), if any.
    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "reader" => Role::Reader,
            "operator" => Role::Operator,
            "admin" => Role::Admin,
            "agent" => Role::Agent,
            "coordinator" => Role::Coordinator,
            _ => return None,
        })
    }
}

/// Who a peer certificate names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Its role (the subject's OU).
    pub role: Role,
    /// Its name (the subject's CN): a node id for an agent, `node-<id>` for a coordinator.
    pub name: String,
    /// The certificate's serial number as [`normalize_serial`] writes it.
    pub serial: String,
    /// The certificate's fingerprint ([`fingerprint_of`]): what a pinned member must present.
    pub fingerprint: String,
}

/// A certificate that names no identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertificateError {
    /// Not an X.509 certificate.
    #[error("unreadable certificate: {0}")]
    Unreadable(String),
    /// Its subject has no OU.
    #[error("the certificate's subject has no OU (role)")]
    NoRole,
    /// Its OU is no role.
    #[error("unknown role `{0}` in the certificate's OU")]
    UnknownRole(String),
    /// Its subject has no CN.
    #[error("the certificate's subject has no CN (name)")]
    NoName,
}

/// `--tls-cert`, `--tls-key` and `--tls-ca` given only in part: the flags missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("TLS needs --tls-cert, --tls-key and --tls-ca together; missing {}", .0.join(", "))]
pub struct MissingTlsFlags(pub Vec<&'static str>);

impl Identity {
    /// Reads the identity from a DER certificate's subject.
    pub fn from_der(der: &[u8]) -> Result<Identity, CertificateError> {
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|e| CertificateError::Unreadable(e.to_string()))?;
        let subject = cert.subject();
        let ou =
            subject.iter_organizational_unit().next().and_then(|a| a.as_str().ok()).ok_or(CertificateError::NoRole)?;
        let role = Role::parse(ou).ok_or_else(|| CertificateError::UnknownRole(ou.to_string()))?;
        let name = subject
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok())
            .ok_or(CertificateError::NoName)?
            .to_string();
        Ok(Identity { role, name, serial: serial_hex(cert.raw_serial()), fingerprint: fingerprint_of(der) })
    }

    /// The identity the first certificate of PEM file `path` names.
    pub fn from_pem_file(path: &Path) -> Result<Identity, AuthError> {
        let pem = read(path)?;
        let der = pem_to_der(&pem).ok_or_else(|| AuthError::File {
            path: path.to_path_buf(),
            message: "no PEM certificate in the file".into(),
        })?;
        Identity::from_der(&der).map_err(|e| AuthError::File { path: path.to_path_buf(), message: e.to_string() })
    }

    /// The coordinator member id of a coordinator identity (`node-<id>`).
    pub fn member_id(&self) -> Option<u64> {
        (self.role == Role::Coordinator).then(|| self.name.strip_prefix("node-")?.parse().ok()).flatten()
    }
}

/// A DER certificate's fingerprint as Tessera writes and compares them: `sha256:` and the lowercase hex of the
/// SHA-256 digest of the DER bytes (what `openssl x509 -fingerprint -sha256` prints, without colons, lowercased).
pub fn fingerprint_of(der: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A fingerprint as [`fingerprint_of`] writes it, from `sha256:HEX` or `HEX` with or without colons, any case;
/// `None` unless it is 32 bytes of hex.
pub fn normalize_fingerprint(text: &str) -> Option<String> {
    let hex = text.trim();
    let hex = hex.strip_prefix("sha256:").or_else(|| hex.strip_prefix("SHA256:")).unwrap_or(hex);
    let hex: String = hex.chars().filter(|c| *c != ':').map(|c| c.to_ascii_lowercase()).collect();
    (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit())).then(|| format!("sha256:{hex}"))
}

/// The serial number of a DER certificate as [`normalize_serial`] writes it (`None`: not a certificate).
pub fn serial_of(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(serial_hex(cert.raw_serial()))
}

/// Raw serial bytes as [`normalize_serial`] writes them.
fn serial_hex(raw: &[u8]) -> String {
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    normalize_serial(&hex).unwrap_or(hex)
}

/// A certificate serial number as Tessera compares them: lowercase hex, without colons or leading zeros (`openssl x509
/// -serial` and DER's sign byte agree then); `None` unless it is 1 to 20 bytes of hex.
pub fn normalize_serial(serial: &str) -> Option<String> {
    let hex: String = serial.chars().filter(|c| *c != ':').map(|c| c.to_ascii_lowercase()).collect();
    if hex.is_empty() || hex.len() > 42 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let trimmed = hex.trim_start_matches('0');
    let value = if trimmed.is_empty() { "0" } else { trimmed };
    (value.len() <= 40).then(|| value.to_string())
}

/// What a call needs of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need<'a> {
    /// A reader (or more).
    Reader,
    /// An operator (or admin).
    Operator,
    /// An admin.
    Admin,
    /// The agent of this node (or a coordinator forwarding for it).
    AgentOf(&'a str),
    /// A coordinator member.
    Coordinator,
    /// Coordinator member `id` itself (Raft messages claiming to come from it).
    Member(u64),
    /// A caller of the Raft service before its body is read: a coordinator member, or an admin (fault injection).
    RaftPeer,
}

impl Need<'_> {
    /// Whether `who` may make the call.
    pub fn allows(&self, who: &Identity) -> bool {
        match (*self, who.role) {
            (Need::Member(id), Role::Coordinator) => who.member_id() == Some(id),
            (Need::Member(_), _) => false,
            (Need::RaftPeer, r) => matches!(r, Role::Coordinator | Role::Admin),
            (_, Role::Coordinator) => true,
            (Need::Reader, r) => matches!(r, Role::Reader | Role::Operator | Role::Admin),
            (Need::Operator, r) => matches!(r, Role::Operator | Role::Admin),
            (Need::Admin, r) => r == Role::Admin,
            (Need::AgentOf(node), Role::Agent) => who.name == node,
            (Need::AgentOf(_), _) | (Need::Coordinator, _) => false,
        }
    }

    fn describe(&self) -> String {
        match self {
            Need::Reader => "role reader (or operator, admin)".into(),
            Need::Operator => "role operator (or admin)".into(),
            Need::Admin => "role admin".into(),
            Need::AgentOf(node) => format!("the agent of node {node}"),
            Need::Coordinator => "a coordinator member".into(),
            Need::Member(id) => format!("coordinator member {id} (certificate CN node-{id})"),
            Need::RaftPeer => "a coordinator member (or an admin)".into(),
        }
    }
}

/// Errors reading TLS files or making the PKI.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// A file could not be read or written.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// Certificate generation failed.
    #[error("certificate generation: {0}")]
    Generate(String),
}

fn read(path: &Path) -> Result<Vec<u8>, AuthError> {
    std::fs::read(path).map_err(|e| AuthError::File { path: path.to_path_buf(), message: format!("cannot read: {e}") })
}

/// A certificate, its private key and the CA that signs the cluster's certificates (PEM files). In a service's TOML
/// config it is the `[tls]` table (`cert`, `key`, `ca`), its paths relative to the config file
/// ([`TlsFiles::relative_to`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// This process's certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA certificate peers must be signed by.
    pub ca: PathBuf,
}

impl TlsFiles {
    /// The same files, relative paths taken from `base` (the folder of the config file that names them).
    pub fn relative_to(&self, base: &Path) -> TlsFiles {
        TlsFiles { cert: base.join(&self.cert), key: base.join(&self.key), ca: base.join(&self.ca) }
    }

    /// `--tls-cert`, `--tls-key` and `--tls-ca` together, or none of them (`Ok(None)`); one or two alone is an
    /// error naming what is missing.
    pub fn from_flags(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        ca: Option<PathBuf>,
    ) -> Result<Option<TlsFiles>, MissingTlsFlags> {
        match (cert, key, ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles { cert, key, ca })),
            (c, k, a) => {
                let missing: Vec<&str> =
                    [(c.is_none(), "--tls-cert"), (k.is_none(), "--tls-key"), (a.is_none(), "--tls-ca")]
                        .into_iter()
                        .filter_map(|(m, n)| m.then_some(n))
                        .collect();
                Err(MissingTlsFlags(missing))
            }
        }
    }

    fn identity(&self) -> Result<TlsIdentity, AuthError> {
        Ok(TlsIdentity::from_pem(read(&self.cert)?, read(&self.key)?))
    }

    fn ca_cert(&self) -> Result<Certificate, AuthError> {
        Ok(Certificate::from_pem(read(&self.ca)?))
    }

    /// This process's own identity, read from its certificate.
    pub fn own_identity(&self) -> Result<Identity, AuthError> {
        Identity::from_pem_file(&self.cert)
    }

    /// Server settings: present this certificate, and require a client certificate signed by the CA.
    pub fn server(&self) -> Result<ServerTlsConfig, AuthError> {
        Ok(ServerTlsConfig::new().identity(self.identity()?).client_ca_root(self.ca_cert()?))
    }

    /// Client settings: present this certificate, and accept a server whose certificate the CA signed for
    /// `server_name` (a DNS name in its subject alternative names).
    pub fn client(&self, server_name: &str) -> Result<ClientTlsConfig, AuthError> {
        Ok(ClientTlsConfig::new().identity(self.identity()?).ca_certificate(self.ca_cert()?).domain_name(server_name))
    }
}

/// The DER bytes of the first certificate in a PEM file.
fn pem_to_der(pem: &[u8]) -> Option<Vec<u8>> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    (pem.label == "CERTIFICATE").then_some(pem.contents)
}

/// A refusal counter: called with the refusal's kind (`unauthenticated` or `permission_denied`) and what was needed.
pub type OnRefusal = Arc<dyn Fn(&'static str, &str) + Send + Sync>;

/// A check of the caller beyond its role, made on every call its role allows (`Err` says why it is refused): a
/// coordinator identity must name a current member, a revoked certificate is refused.
pub type Gate = Arc<dyn Fn(&Identity) -> Result<(), String> + Send + Sync>;

/// How a server checks its callers.
#[derive(Clone)]
pub struct Auth {
    secure: bool,
    on_refusal: Option<OnRefusal>,
    gate: Option<Gate>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth").field("secure", &self.secure).finish()
    }
}

impl Auth {
    /// No TLS: every caller may do everything (`--insecure`: local development and the in-process replay).
    pub fn insecure() -> Auth {
        Auth { secure: false, on_refusal: None, gate: None }
    }

    /// Mutual TLS: callers are who their certificates say, and may do what their roles allow.
    pub fn mutual_tls() -> Auth {
        Auth { secure: true, on_refusal: None, gate: None }
    }

    /// Calls `f` on every refusal (to count them).
    pub fn on_refusal(mut self, f: OnRefusal) -> Auth {
        self.on_refusal = Some(f);
        self
    }

    /// Checks every caller its role allows with `gate` too (membership, revocation).
    pub fn gate(mut self, gate: Gate) -> Auth {
        self.gate = Some(gate);
        self
    }

    /// Whether callers are checked.
    pub fn is_secure(&self) -> bool {
        self.secure
    }

    /// Checks that the caller of `req` may make a call that needs `need`. Returns who it is (`None` without TLS).
    pub fn check<T>(&self, req: &Request<T>, need: Need<'_>) -> Result<Option<Identity>, Status> {
        if !self.secure {
            return Ok(None);
        }
        let refuse = |kind: &'static str, status: Status| {
            if let Some(f) = &self.on_refusal {
                f(kind, &need.describe());
            }
            Err(status)
        };
        let Some(der) = req.peer_certs().and_then(|c| c.first().map(|c| c.to_vec())) else {
            return refuse(
                "unauthenticated",
                Status::unauthenticated(format!("no client certificate; this call needs {}", need.describe())),
            );
        };
        let who = match Identity::from_der(&der) {
            Ok(w) => w,
            Err(e) => return refuse("unauthenticated", Status::unauthenticated(e.to_string())),
        };
        if need.allows(&who) {
            match self.gate.as_ref().map_or(Ok(()), |g| g(&who)) {
                Ok(()) => Ok(Some(who)),
                Err(why) => refuse(
                    "permission_denied",
                    Status::permission_denied(format!(
                        "{} `{}` may not make this call: {why}",
                        who.role.name(),
                        who.name
                    )),
                ),
            }
        } else {
            refuse(
                "permission_denied",
                Status::permission_denied(format!(
                    "{} `{}` may not make this call: it needs {}",
                    who.role.name(),
                    who.name,
                    need.describe()
                )),
            )
        }
    }
}

/// How long the certificates of identities last by default, in days: short, so that a stolen key stops working by
/// itself (rotate with `coordinator certs issue`, which servers pick up without a restart).
pub const CERT_LIFETIME_DAYS: u32 = 90;
/// How long the development CA lasts, in days; no certificate it issues outlives it.
pub const CA_LIFETIME_DAYS: u32 = 3 * 365;

/// What [`init_pki`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pki {
    /// The CA certificate.
    pub ca: PathBuf,
    /// Each identity's name, certificate and key.
    pub identities: Vec<(String, PathBuf, PathBuf)>,
}

/// Writes a development PKI to `out`: `ca.pem` and `ca.key`, and for each identity `NAME.pem` and `NAME.key`:
/// coordinators `node-1`..`node-<nodes>` (server and client, DNS names `node-<i>`, [`COORDINATOR_SERVER_NAME`],
/// `localhost` and `hosts`), agents named `agents` (server and client, DNS names the agent's name, `localhost` and
/// `hosts`), and the clients `admin`, `operator` and `reader`, each valid for `days` days (at most
/// [`CA_LIFETIME_DAYS`]; [`CERT_LIFETIME_DAYS`] is the default). Keys are written readable by their owner only.
pub fn init_pki(out: &Path, nodes: u32, agents: &[String], hosts: &[String], days: u32) -> Result<Pki, AuthError> {
    check_days(days)?;
    std::fs::create_dir_all(out)
        .map_err(|e| AuthError::File { path: out.to_path_buf(), message: format!("cannot create: {e}") })?;
    // Every identity is a file NAME.pem: an agent named like a member or a client would overwrite its certificate.
    let reserved = |a: &str| {
        ["admin", "operator", "reader", "ca"].contains(&a)
            || a.strip_prefix("node-").and_then(|i| i.parse::<u32>().ok()).is_some_and(|i| (1..=nodes).contains(&i))
    };
    if let Some(a) = agents.iter().find(|a| reserved(a)) {
        return Err(AuthError::Generate(format!(
            "agent name `{a}` is also a coordinator's or a client's (node-1..node-{nodes}, admin, operator, reader): \
             give the node another id (sim-agent run --node-prefix)"
        )));
    }
    let ca_key = rcgen::KeyPair::generate().map_err(gen_err)?;
    let ca_params = ca_params(CA_LIFETIME_DAYS);
    let ca_cert = ca_params.self_signed(&ca_key).map_err(gen_err)?;
    let ca = write_file(&out.join("ca.pem"), &ca_cert.pem(), false)?;
    write_file(&out.join("ca.key"), &ca_key.serialize_pem(), true)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let mut wanted: Vec<(String, Role)> = Vec::new();
    wanted.extend((1..=nodes).map(|i| (format!("node-{i}"), Role::Coordinator)));
    wanted.extend(agents.iter().map(|a| (a.clone(), Role::Agent)));
    wanted.extend(
        [("admin", Role::Admin), ("operator", Role::Operator), ("reader", Role::Reader)].map(|(n, r)| (n.into(), r)),
    );
    let mut identities = Vec::new();
    for (name, role) in wanted {
        let (cert, key) = issue_with(&issuer, out, &name, role, hosts, days)?;
        identities.push((name, cert, key));
    }
    Ok(Pki { ca, identities })
}

/// Issues (or re-issues, to rotate it) the certificate of one identity with the CA of a PKI that [`init_pki`] wrote
/// to `dir` (`ca.pem`, `ca.key`): a new key and certificate, `NAME.pem` and `NAME.key`, each replaced in one rename
/// so a server reloading them never reads half a file, valid for `days` days (as [`init_pki`]'s). Returns their
/// paths.
pub fn issue(dir: &Path, name: &str, role: Role, hosts: &[String], days: u32) -> Result<(PathBuf, PathBuf), AuthError> {
    check_days(days)?;
    let key_path = dir.join("ca.key");
    let pem = String::from_utf8(read(&key_path)?)
        .map_err(|_| AuthError::File { path: key_path.clone(), message: "not a PEM key".into() })?;
    let ca_key = rcgen::KeyPair::from_pem(&pem)
        .map_err(|e| AuthError::File { path: key_path.clone(), message: format!("not a CA key: {e}") })?;
    // The issuer is named as in ca.pem; check that this key is the one ca.pem carries before signing with it.
    let ca_pem = read(&dir.join("ca.pem"))?;
    let ca_der = pem_to_der(&ca_pem).ok_or_else(|| AuthError::File {
        path: dir.join("ca.pem"),
        message: "no PEM certificate in the file".into(),
    })?;
    let (_, ca_cert) = x509_parser::parse_x509_certificate(&ca_der)
        .map_err(|e| AuthError::File { path: dir.join("ca.pem"), message: format!("not a certificate: {e}") })?;
    if ca_cert.public_key().subject_public_key.data.as_ref() != ca_key.public_key_raw() {
        return Err(AuthError::File { path: key_path, message: "is not the key of ca.pem".into() });
    }
    // Rotating keeps an identity's role: another role under the same name would take over its file.
    let existing = TlsFiles { cert: dir.join(format!("{name}.pem")), key: PathBuf::new(), ca: PathBuf::new() };
    if existing.cert.exists() {
        let had = existing.own_identity()?;
        if had.role != role {
            return Err(AuthError::Generate(format!(
                "`{name}` is a {}'s certificate; not issuing it as a {} (pick another name)",
                had.role.name(),
                role.name()
            )));
        }
    }
    let issuer = rcgen::Issuer::new(ca_params(CA_LIFETIME_DAYS), ca_key);
    issue_with(&issuer, dir, name, role, hosts, days)
}

fn gen_err(e: rcgen::Error) -> AuthError {
    AuthError::Generate(e.to_string())
}

/// From now for `days` days.
fn validity(p: &mut rcgen::CertificateParams, days: u32) {
    let now = std::time::SystemTime::now();
    p.not_before = now.into();
    p.not_after = (now + std::time::Duration::from_secs(u64::from(days) * 24 * 3600)).into();
}

/// A certificate lifetime is 1 day to [`CA_LIFETIME_DAYS`].
fn check_days(days: u32) -> Result<(), AuthError> {
    if (1..=CA_LIFETIME_DAYS).contains(&days) {
        Ok(())
    } else {
        Err(AuthError::Generate(format!(
            "a certificate lasts 1 to {CA_LIFETIME_DAYS} days (the CA's life), not {days}"
        )))
    }
}

/// The development CA's settings (its name is what issued certificates name as their issuer).
fn ca_params(days: u32) -> rcgen::CertificateParams {
    use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyUsagePurpose};
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "tessera development CA");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut params, days);
    params
}

/// Writes `contents` to `path` through a temporary file and a rename; `private` files are readable by the owner only.
fn write_file(path: &Path, contents: &str, private: bool) -> Result<PathBuf, AuthError> {
    let err = |e: std::io::Error| AuthError::File { path: path.to_path_buf(), message: format!("cannot write: {e}") };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).map_err(err)?;
    if private {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
        }
    }
    std::fs::rename(&tmp, path).map_err(err)?;
    Ok(path.to_path_buf())
}

fn issue_with(
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
    out: &Path,
    name: &str,
    role: Role,
    hosts: &[String],
    days: u32,
) -> Result<(PathBuf, PathBuf), AuthError> {
    use rcgen::{CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose};
    let mut sans = match role {
        Role::Coordinator => vec![name.to_string(), COORDINATOR_SERVER_NAME.to_string(), "localhost".into()],
        Role::Agent => vec![name.to_string(), "localhost".into()],
        _ => vec![name.to_string()],
    };
    if matches!(role, Role::Coordinator | Role::Agent) {
        sans.extend(hosts.iter().cloned());
    }
    sans.push("127.0.0.1".into());
    let mut params = CertificateParams::new(sans).map_err(gen_err)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationalUnitName, role.name());
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = match role {
        Role::Coordinator | Role::Agent => {
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth]
        }
        _ => vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    validity(&mut params, days);
    let key = KeyPair::generate().map_err(gen_err)?;
    let cert = params.signed_by(&key, issuer).map_err(gen_err)?;
    // The key first: a reload between the two renames fails (they do not match) and keeps the old pair.
    let key_path = write_file(&out.join(format!("{name}.key")), &key.serialize_pem(), true)?;
    let cert_path = write_file(&out.join(format!("{name}.pem")), &cert.pem(), false)?;
    Ok((cert_path, key_path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pki_names_roles_and_members_and_roles_nest() {
        let dir = tempfile::tempdir().unwrap();
        let pki = init_pki(dir.path(), 2, &["agent-1".into()], &[], CERT_LIFETIME_DAYS).unwrap();
        let names: Vec<&str> = pki.identities.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, ["node-1", "node-2", "agent-1", "admin", "operator", "reader"]);
        let who = |name: &str| {
            let (_, cert, key) = pki.identities.iter().find(|(n, _, _)| n == name).unwrap();
            TlsFiles { cert: cert.clone(), key: key.clone(), ca: pki.ca.clone() }.own_identity().unwrap()
        };
        let node2 = who("node-2");
        assert_eq!((node2.role, node2.member_id()), (Role::Coordinator, Some(2)));
        let reader = who("reader");
        let operator = who("operator");
        let admin = who("admin");
        let agent = who("agent-1");
        assert_eq!((agent.role, agent.name.as_str()), (Role::Agent, "agent-1"));
        assert_eq!(normalize_serial(&agent.serial).as_deref(), Some(agent.serial.as_str()), "{agent:?}");
        assert_eq!(normalize_serial("00:1A:2b").as_deref(), Some("1a2b"));
        assert_eq!(normalize_serial("0").as_deref(), Some("0"));
        for bad in ["", "xyz", &"f".repeat(41)] {
            assert_eq!(normalize_serial(bad), None, "{bad}");
        }
        // Fingerprints: one per certificate, as openssl prints them too.
        assert!(node2.fingerprint.starts_with("sha256:") && node2.fingerprint.len() == 71, "{node2:?}");
        assert_ne!(node2.fingerprint, who("node-1").fingerprint);
        let openssl_style: String = node2.fingerprint[7..]
            .to_uppercase()
            .as_bytes()
            .chunks(2)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<Vec<_>>()
            .join(":");
        assert_eq!(
            normalize_fingerprint(&format!("SHA256:{openssl_style}")).as_deref(),
            Some(node2.fingerprint.as_str())
        );
        for bad in ["", "sha256:xyz", &"f".repeat(63)] {
            assert_eq!(normalize_fingerprint(bad), None, "{bad}");
        }
        assert!(Need::Reader.allows(&reader) && !Need::Operator.allows(&reader));
        assert!(Need::Operator.allows(&operator) && !Need::Admin.allows(&operator));
        assert!(Need::Admin.allows(&admin) && Need::Reader.allows(&admin));
        assert!(Need::AgentOf("agent-1").allows(&agent) && !Need::AgentOf("node-0").allows(&agent));
        assert!(!Need::Reader.allows(&agent) && !Need::Coordinator.allows(&admin));
        assert!(Need::Member(2).allows(&node2) && !Need::Member(1).allows(&node2));
        assert!(Need::Operator.allows(&node2), "a member forwards calls it checked");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("admin.key")).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn certificates_are_short_lived_and_never_outlive_the_ca() {
        let days_of = |path: &Path| {
            let der = pem_to_der(&std::fs::read(path).unwrap()).unwrap();
            let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
            let v = cert.validity();
            (v.not_after.timestamp() - v.not_before.timestamp()) / (24 * 3600)
        };
        let dir = tempfile::tempdir().unwrap();
        init_pki(dir.path(), 1, &[], &[], CERT_LIFETIME_DAYS).unwrap();
        assert_eq!(days_of(&dir.path().join("node-1.pem")), i64::from(CERT_LIFETIME_DAYS));
        assert_eq!(days_of(&dir.path().join("ca.pem")), i64::from(CA_LIFETIME_DAYS));
        let (cert, _) = issue(dir.path(), "ops-bot", Role::Operator, &[], 7).unwrap();
        assert_eq!(days_of(&cert), 7);
        for days in [0, CA_LIFETIME_DAYS + 1] {
            let e = issue(dir.path(), "ops-bot", Role::Operator, &[], days).unwrap_err().to_string();
            assert!(e.contains("1 to 1095 days"), "{e}");
            assert!(init_pki(&dir.path().join("x"), 1, &[], &[], days).is_err());
        }
    }

    #[test]
    fn a_reissued_certificate_is_new_signed_by_the_same_ca_and_keeps_its_role() {
        let dir = tempfile::tempdir().unwrap();
        init_pki(dir.path(), 2, &[], &[], CERT_LIFETIME_DAYS).unwrap();
        let before = std::fs::read(dir.path().join("node-2.pem")).unwrap();
        let (cert, key) = issue(dir.path(), "node-2", Role::Coordinator, &[], CERT_LIFETIME_DAYS).unwrap();
        assert_ne!(std::fs::read(&cert).unwrap(), before);
        let files = TlsFiles { cert, key, ca: dir.path().join("ca.pem") };
        assert_eq!(files.own_identity().unwrap().member_id(), Some(2));
        crate::reload::server_config(&files).expect("the new pair matches and the CA verifies it");
        let e = issue(dir.path(), "node-2", Role::Admin, &[], CERT_LIFETIME_DAYS).unwrap_err().to_string();
        assert!(e.contains("coordinator's certificate"), "{e}");
        issue(dir.path(), "ops-bot", Role::Operator, &[], CERT_LIFETIME_DAYS).unwrap();
        // A CA key that is not ca.pem's is refused.
        let other = tempfile::tempdir().unwrap();
        init_pki(other.path(), 1, &[], &[], CERT_LIFETIME_DAYS).unwrap();
        std::fs::copy(other.path().join("ca.key"), dir.path().join("ca.key")).unwrap();
        let e = issue(dir.path(), "node-1", Role::Coordinator, &[], CERT_LIFETIME_DAYS).unwrap_err().to_string();
        assert!(e.contains("is not the key of ca.pem"), "{e}");
    }

    #[test]
    fn agents_may_not_take_a_member_or_client_name() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["node-1", "admin", "ca"] {
            let e = init_pki(dir.path(), 3, &[bad.to_string()], &[], CERT_LIFETIME_DAYS).unwrap_err().to_string();
            assert!(e.contains(&format!("`{bad}`")), "{e}");
        }
        init_pki(dir.path(), 3, &["node-0".into(), "node-4".into()], &[], CERT_LIFETIME_DAYS).unwrap();
    }

    #[test]
    fn tls_flags_come_together() {
        assert_eq!(TlsFiles::from_flags(None, None, None), Ok(None));
        let e = TlsFiles::from_flags(Some("c".into()), None, None).unwrap_err();
        assert_eq!(e, MissingTlsFlags(vec!["--tls-key", "--tls-ca"]));
        assert!(e.to_string().contains("--tls-key, --tls-ca"), "{e}");
        let f = TlsFiles::from_flags(Some("c".into()), Some("k".into()), Some("a".into())).unwrap().unwrap();
        let e = f.server().unwrap_err().to_string();
        assert!(e.starts_with("c: cannot read"), "{e}");
    }
}
