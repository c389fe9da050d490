//! `coordinator certs`: the development PKI, fingerprints, and revocations through the cluster.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;
use tessera_coordinator::client::Retry;
use tessera_proto::v1;

use crate::client::{ClientArgs, Failure, client, out, print};

#[derive(Subcommand)]
pub(crate) enum CertsCmd {
    /// Write a development PKI: DIR/ca.pem (and ca.key), and NAME.pem and NAME.key for node-1..node-N
    /// (coordinators), the agents, and the clients admin, operator and reader.
    Init {
        /// Directory to write to.
        #[arg(long)]
        out: PathBuf,
        /// Coordinator members (node-1..node-N).
        #[arg(long, default_value_t = 3)]
        nodes: u32,
        /// Agents agent-1..agent-N (an agent's certificate names the node id it may speak for).
        #[arg(long, default_value_t = 0)]
        agents: u32,
        /// Further agent names (node ids), e.g. --agent node-a-0.
        #[arg(long = "agent", value_name = "NODE_ID")]
        agent_names: Vec<String>,
        /// Further host names the coordinators and agents are reached at (each certificate also names itself,
        /// localhost and 127.0.0.1).
        #[arg(long = "host", value_name = "NAME")]
        hosts: Vec<String>,
        /// How long each certificate lasts (short, so that a stolen key stops working by itself; rotate with
        /// `certs issue`). The CA lasts 1,095 days.
        #[arg(long, default_value_t = tessera_auth::CERT_LIFETIME_DAYS)]
        days: u32,
    },
    /// Issue a new key and certificate for one identity with the CA that `certs init` wrote to DIR: to rotate a
    /// certificate (servers reload theirs on SIGHUP or when the files change) or to add an agent or client.
    Issue {
        /// The PKI directory (holds ca.pem and ca.key); NAME.pem and NAME.key are written there.
        #[arg(long)]
        dir: PathBuf,
        /// The identity: node-N for coordinator member N, a node id for an agent, any name for a client.
        #[arg(long)]
        name: String,
        /// coordinator, agent, admin, operator or reader.
        #[arg(long)]
        role: String,
        /// Further host names a coordinator or agent is reached at.
        #[arg(long = "host", value_name = "NAME")]
        hosts: Vec<String>,
        /// How long the certificate lasts.
        #[arg(long, default_value_t = tessera_auth::CERT_LIFETIME_DAYS)]
        days: u32,
    },
    /// Print a certificate's fingerprint (`sha256:HEX`), as `member_pins` takes it.
    Fingerprint {
        /// The certificate (PEM).
        #[arg(long, value_name = "FILE")]
        cert: PathBuf,
    },
    /// Revoke a certificate on a running cluster (admin): every member refuses its calls, Raft included, from then
    /// on. Give the certificate's PEM file, or its serial number (hex, as `openssl x509 -serial` prints it).
    Revoke {
        /// The certificate to revoke.
        #[arg(long, value_name = "FILE", required_unless_present = "serial", conflicts_with = "serial")]
        cert: Option<PathBuf>,
        /// Its serial number instead.
        #[arg(long, value_name = "HEX")]
        serial: Option<String>,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// The certificates revoked on a running cluster.
    Revoked {
        #[command(flatten)]
        c: ClientArgs,
    },
}

/// Runs a `certs` command.
pub(crate) async fn run(cmd: CertsCmd) -> anyhow::Result<()> {
    match cmd {
        CertsCmd::Init { out: dir, nodes, agents, agent_names, hosts, days } => {
            let mut names: Vec<String> = (1..=agents).map(|i| format!("agent-{i}")).collect();
            names.extend(agent_names);
            let pki = tessera_auth::init_pki(&dir, nodes, &names, &hosts, days).map_err(|e| anyhow::anyhow!("{e}"))?;
            let mut lines = vec![format!("CA: {}", pki.ca.display())];
            lines.extend(pki.identities.iter().map(|(n, c, k)| format!("{n}: {} {}", c.display(), k.display())));
            out(&lines.join("\n"));
            Ok(())
        }
        CertsCmd::Issue { dir, name, role, hosts, days } => {
            let role = tessera_auth::Role::parse(&role).ok_or_else(|| {
                Failure::usage(format!("--role `{role}`: one of coordinator, agent, admin, operator, reader"))
            })?;
            if role == tessera_auth::Role::Coordinator
                && name.strip_prefix("node-").and_then(|i| i.parse::<u64>().ok()).is_none_or(|i| i == 0)
            {
                return Err(Failure::usage(format!("--name `{name}`: a coordinator is node-N, N its member id")));
            }
            let (cert, key) =
                tessera_auth::issue(&dir, &name, role, &hosts, days).map_err(|e| anyhow::anyhow!("{e}"))?;
            out(&format!("{name}: {} {}", cert.display(), key.display()));
            Ok(())
        }
        CertsCmd::Fingerprint { cert } => {
            let who = tessera_auth::Identity::from_pem_file(&cert).map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("{}", who.fingerprint);
            Ok(())
        }
        CertsCmd::Revoke { cert, serial, c } => {
            let (serial, name, role) = match (cert, serial) {
                (Some(path), _) => {
                    let who =
                        tessera_auth::Identity::from_pem_file(&path).map_err(|e| Failure::usage(e.to_string()))?;
                    (who.serial, who.name, who.role.name().to_string())
                }
                (None, Some(serial)) => (serial, String::new(), String::new()),
                (None, None) => return Err(Failure::usage("--cert or --serial is required")),
            };
            let request = v1::RevokeCertificateRequest { serial: serial.clone(), name: name.clone(), role };
            let r = client(&c)?
                .call_with(Retry::Once, |mut x| {
                    let request = request.clone();
                    async move { x.revoke_certificate(request).await }
                })
                .await?;
            print(
                c.json(),
                json!({"serial": serial, "name": name, "index": r.index}),
                format!("revoked {serial} {name} at index {}", r.index),
            );
            Ok(())
        }
        CertsCmd::Revoked { c } => {
            let r =
                client(&c)?.call(|mut x| async move { x.list_revoked(v1::ListRequest { stale: false }).await }).await?;
            let lines: Vec<String> =
                r.certificates.iter().map(|c| format!("{:>8}  {}  {} {}", c.index, c.serial, c.role, c.name)).collect();
            let js: Vec<_> = r
                .certificates
                .iter()
                .map(|c| json!({"serial": c.serial, "name": c.name, "role": c.role, "index": c.index}))
                .collect();
            print(c.json(), json!(js), if lines.is_empty() { "(none revoked)".into() } else { lines.join("\n") });
            Ok(())
        }
    }
}
