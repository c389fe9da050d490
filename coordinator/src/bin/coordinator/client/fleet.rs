//! The fleet and the cluster: `status`, `node`, `gpu` and `member`.

use clap::Subcommand;
use serde_json::json;
use tessera_coordinator::client::{Client, Retry, assignments_text, layout_text};
use tessera_proto::v1;

use super::{ClientArgs, client, effective_gpu_health, members_json, print};

#[derive(Subcommand)]
pub(crate) enum NodeCmd {
    /// List nodes and GPUs.
    List {
        #[command(flatten)]
        c: ClientArgs,
    },
}

#[derive(Subcommand)]
pub(crate) enum GpuCmd {
    /// Drain a GPU (NODE/INDEX): it keeps its work and gets none new.
    Drain {
        /// GPU id.
        gpu: String,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Mark a drained GPU healthy again.
    Undrain {
        /// GPU id.
        gpu: String,
        #[command(flatten)]
        c: ClientArgs,
    },
}

#[derive(Subcommand)]
pub(crate) enum MemberCmd {
    /// Add a voting member; then start it with `serve --join`.
    Add {
        /// Its Raft id.
        id: u64,
        /// Its address, HOST:PORT.
        address: String,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Remove a member.
    Rm {
        /// Its Raft id.
        id: u64,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// List members.
    List {
        #[command(flatten)]
        c: ClientArgs,
    },
}

/// `coordinator status`.
pub(crate) async fn status(c: ClientArgs) -> anyhow::Result<()> {
    let s = client(&c)?.call(|mut x| async move { x.cluster_status(v1::ClusterStatusRequest {}).await }).await?;
    let members: Vec<String> = s.members.iter().map(|m| format!("{}={}", m.id, m.address)).collect();
    let round: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&s.round_settings_json)
        .map_err(|e| anyhow::anyhow!("the node's round settings are not JSON: {e}"))?;
    let settings: Vec<String> = round.iter().map(|(k, v)| format!("{k} = {v}")).collect();
    print(
        c.json(),
        json!({
            "id": s.id, "role": s.role, "leader_id": s.leader_id, "leader_address": s.leader_address,
            "term": s.term, "commit_index": s.commit_index, "applied_index": s.applied_index,
            "members": members_json(&s.members), "workload_time_ms": s.workload_time_ms, "plan_epoch": s.plan_epoch,
            "policy": s.policy, "planner": round,
        }),
        format!(
            "node {} ({})\nleader: {} at {}\nterm {}  commit {}  applied {}\nmembers: {}\nplan epoch {}  workload time {} ms\n\
             policy {}\n[planner] {}",
            s.id,
            s.role,
            s.leader_id,
            s.leader_address,
            s.term,
            s.commit_index,
            s.applied_index,
            members.join(", "),
            s.plan_epoch,
            s.workload_time_ms,
            s.policy,
            settings.join(", ")
        ),
    );
    Ok(())
}

/// Runs a `node` command.
pub(crate) async fn node(cmd: NodeCmd) -> anyhow::Result<()> {
    match cmd {
        NodeCmd::List { c } => {
            let r =
                client(&c)?.call(|mut x| async move { x.list_nodes(v1::ListRequest { stale: false }).await }).await?;
            let mut lines = Vec::new();
            let mut js = Vec::new();
            for n in &r.nodes {
                let why = if n.health_reason.is_empty() { String::new() } else { format!(" ({})", n.health_reason) };
                lines.push(format!("{} at {}  {}{why}", n.id, n.address, n.health));
                let mut gj = Vec::new();
                for g in &n.gpus {
                    let health = effective_gpu_health(&n.health, &g.health);
                    lines.push(format!(
                        "  {} {} {}  applied [{}] epoch {}  target [{}] epoch {}",
                        g.id,
                        g.model,
                        health,
                        layout_text(&g.applied),
                        g.applied_epoch,
                        layout_text(&g.target.as_ref().and_then(|t| t.layout.clone())),
                        g.target_epoch
                    ));
                    gj.push(json!({
                    "id": g.id, "model": g.model, "health": health, "gpu_health": g.health, "applied": layout_text(&g.applied),
                    "applied_epoch": g.applied_epoch, "applied_assignments": assignments_text(&g.applied_assignments),
                    "target": layout_text(&g.target.as_ref().and_then(|t| t.layout.clone())), "target_epoch": g.target_epoch,
                }));
                }
                js.push(json!({
                    "id": n.id, "address": n.address, "health": n.health, "health_reason": n.health_reason,
                    "health_since_ms": n.health_since_ms, "gpus": gj,
                }));
            }
            print(c.json(), json!(js), if lines.is_empty() { "(no nodes)".into() } else { lines.join("\n") });
            Ok(())
        }
    }
}

/// Runs a `gpu` command.
pub(crate) async fn gpu(cmd: GpuCmd) -> anyhow::Result<()> {
    let (gpu, drain, c) = match cmd {
        GpuCmd::Drain { gpu, c } => (gpu, true, c),
        GpuCmd::Undrain { gpu, c } => (gpu, false, c),
    };
    // Resent after a lost answer, applied once: a late resend cannot undo another operator's newer call.
    let request = Client::new_request_id();
    let r = client(&c)?
        .call(|mut x| {
            let req = Client::request(v1::DrainGpuRequest { gpu: gpu.clone(), drain }, &request);
            async move { x.drain_gpu(req).await }
        })
        .await?;
    print(
        c.json(),
        json!({"gpu": gpu, "draining": drain, "index": r.index}),
        format!("{gpu} {}", if drain { "draining" } else { "healthy" }),
    );
    Ok(())
}

/// Runs a `member` command.
pub(crate) async fn member(cmd: MemberCmd) -> anyhow::Result<()> {
    let (r, c) = match cmd {
        MemberCmd::Add { id, address, c } => (
            client(&c)?
                .call_with(Retry::Once, |mut x| {
                    let address = address.clone();
                    async move { x.add_member(v1::AddMemberRequest { id, address }).await }
                })
                .await?
                .members,
            c,
        ),
        MemberCmd::Rm { id, c } => (
            client(&c)?
                .call_with(Retry::Once, |mut x| async move { x.remove_member(v1::RemoveMemberRequest { id }).await })
                .await?
                .members,
            c,
        ),
        MemberCmd::List { c } => (
            client(&c)?.call(|mut x| async move { x.cluster_status(v1::ClusterStatusRequest {}).await }).await?.members,
            c,
        ),
    };
    print(
        c.json(),
        members_json(&r),
        r.iter().map(|m| format!("{} {}", m.id, m.address)).collect::<Vec<_>>().join("\n"),
    );
    Ok(())
}
