//! `coordinator tenant`: add, update, list, show, pin and remove tenants.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;
use tessera_coordinator::client::Client;
use tessera_proto::v1;

use super::{ClientArgs, Failure, client, print, tenant_json};

#[derive(Subcommand)]
pub(crate) enum TenantCmd {
    /// Create the tenants of a TOML file (configs/tenants format), or replace them with --update.
    Add {
        /// Tenants file.
        #[arg(long)]
        file: PathBuf,
        /// Replace existing tenants instead of creating.
        #[arg(long)]
        update: bool,
        /// With --update and a file of one tenant: replace it only if its revision is still N (the `revision` that
        /// `tenant get` printed), so that a concurrent or late update is not overwritten.
        #[arg(long, value_name = "N", requires = "update")]
        if_revision: Option<u64>,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// List tenants.
    List {
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Show one tenant.
    Get {
        /// Tenant id.
        id: String,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Pin a tenant to GPUs and/or an inference profile, or clear its pin; the next planning round moves it
    /// (make-before-break where the target GPU has room).
    Pin {
        /// Tenant id.
        id: String,
        /// A GPU it may run on (`node/index`); repeat for several. None: any GPU.
        #[arg(long = "gpu", value_name = "NODE/INDEX")]
        gpus: Vec<String>,
        /// The one profile its inference instance may have (1g, 1g.2x, 2g, 3g, 4g, 7g).
        #[arg(long)]
        profile: Option<String>,
        /// Remove the pin: the planner decides again.
        #[arg(long, conflicts_with_all = ["gpus", "profile"])]
        clear: bool,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Delete tenants.
    Rm {
        /// Tenant ids.
        #[arg(required = true)]
        ids: Vec<String>,
        /// With one id: delete only if the tenant's revision is still N.
        #[arg(long, value_name = "N")]
        if_revision: Option<u64>,
        #[command(flatten)]
        c: ClientArgs,
    },
}

/// Runs a `tenant` command.
pub(crate) async fn run(cmd: TenantCmd) -> anyhow::Result<()> {
    match cmd {
        TenantCmd::Add { file, update, if_revision, c } => {
            let specs = tessera_core::config::load_tenants(&file).map_err(|e| Failure::input(e.to_string()))?;
            if if_revision.is_some() && specs.len() != 1 {
                return Err(Failure::usage(format!(
                    "--if-revision needs a file of exactly one tenant; {} has {}",
                    file.display(),
                    specs.len()
                )));
            }
            let cl = client(&c)?;
            let mut out = Vec::new();
            for spec in &specs {
                let req = v1::TenantRequest { spec: Some(spec.into()), if_revision: if_revision.unwrap_or(0) };
                // One id per write, reused by every retry: the cluster applies it once.
                let id = Client::new_request_id();
                let r = if update {
                    cl.call(|mut x| {
                        let req = Client::request(req.clone(), &id);
                        async move { x.update_tenant(req).await }
                    })
                    .await
                } else {
                    cl.call(|mut x| {
                        let req = Client::request(req.clone(), &id);
                        async move { x.create_tenant(req).await }
                    })
                    .await
                }
                .map_err(|s| Failure::status(&format!("tenant {}", spec.id), &s))?;
                out.push((spec.id.to_string(), r.index));
            }
            print(
                c.json(),
                json!(out.iter().map(|(id, i)| json!({"id": id, "index": i})).collect::<Vec<_>>()),
                out.iter()
                    .map(|(id, i)| format!("{} tenant {id} (index {i})", if update { "updated" } else { "created" }))
                    .collect::<Vec<_>>()
                    .join("\n"),
            );
            Ok(())
        }
        TenantCmd::List { c } => {
            let r =
                client(&c)?.call(|mut x| async move { x.list_tenants(v1::ListRequest { stale: false }).await }).await?;
            let lines: Vec<String> = r
                .tenants
                .iter()
                .filter_map(|t| {
                    let s = t.spec.as_ref()?;
                    let pin = s.pin.clone().and_then(|p| tessera_core::tenant::TenantPin::try_from(p).ok());
                    Some(format!(
                        "{:<20} {:<14} slo {:>6.1} ms{}{}",
                        s.id,
                        s.model,
                        s.slo_ms,
                        pin.map(|p| format!("  pinned to {p}")).unwrap_or_default(),
                        if t.retiring { "  (retiring)" } else { "" }
                    ))
                })
                .collect();
            print(
                c.json(),
                r.tenants.iter().map(tenant_json).collect(),
                if lines.is_empty() { "(no tenants)".into() } else { lines.join("\n") },
            );
            Ok(())
        }
        TenantCmd::Get { id, c } => {
            let r = client(&c)?
                .call(|mut x| {
                    let id = id.clone();
                    async move { x.get_tenant(v1::TenantIdRequest { id, ..Default::default() }).await }
                })
                .await?;
            let j = tenant_json(&r);
            print(c.json(), j.clone(), serde_json::to_string_pretty(&j)?);
            Ok(())
        }
        TenantCmd::Pin { id, gpus, profile, clear, c } => {
            if !clear && gpus.is_empty() && profile.is_none() {
                return Err(Failure::usage("give --gpu, --profile or --clear"));
            }
            let pin = v1::TenantPin { gpus, profile: profile.unwrap_or_default() };
            // Checked here for a clear message; the cluster checks again.
            let parsed = tessera_core::tenant::TenantPin::try_from(pin.clone())
                .map_err(|e| Failure::usage(format!("pin.{}: {}", e.field, e.message)))?;
            let cl = client(&c)?;
            let current = cl
                .call(|mut x| {
                    let id = id.clone();
                    async move { x.get_tenant(v1::TenantIdRequest { id, ..Default::default() }).await }
                })
                .await
                .map_err(|s| Failure::status(&format!("tenant {id}"), &s))?;
            let mut spec = current.spec.ok_or_else(|| anyhow::anyhow!("tenant {id}: the answer has no spec"))?;
            spec.pin = (!clear).then_some(pin);
            // Only over the revision read: a concurrent update is not overwritten.
            let req = v1::TenantRequest { spec: Some(spec), if_revision: current.revision };
            let request = Client::new_request_id();
            let r = cl
                .call(|mut x| {
                    let req = Client::request(req.clone(), &request);
                    async move { x.update_tenant(req).await }
                })
                .await
                .map_err(|s| Failure::status(&format!("tenant {id}"), &s))?;
            let shown = if clear { "-".to_string() } else { parsed.to_string() };
            print(
                c.json(),
                json!({"id": id, "pin": if clear { None } else { Some(&parsed) }, "index": r.index}),
                format!("tenant {id} pinned to {shown} (index {})", r.index),
            );
            Ok(())
        }
        TenantCmd::Rm { ids, if_revision, c } => {
            if if_revision.is_some() && ids.len() != 1 {
                return Err(Failure::usage(format!("--if-revision needs exactly one tenant id, got {}", ids.len())));
            }
            let cl = client(&c)?;
            let mut out = Vec::new();
            for id in ids {
                let request = Client::new_request_id();
                let r = cl
                    .call(|mut x| {
                        let msg = v1::TenantIdRequest { id: id.clone(), if_revision: if_revision.unwrap_or(0) };
                        let req = Client::request(msg, &request);
                        async move { x.delete_tenant(req).await }
                    })
                    .await
                    .map_err(|s| Failure::status(&format!("tenant {id}"), &s))?;
                out.push((id, r.retiring));
            }
            print(
                c.json(),
                json!(out.iter().map(|(id, r)| json!({"id": id, "retiring": r})).collect::<Vec<_>>()),
                out.iter()
                    .map(|(id, r)| {
                        if *r {
                            format!("tenant {id} retiring (removed by the next plan)")
                        } else {
                            format!("tenant {id} deleted")
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
            );
            Ok(())
        }
    }
}
