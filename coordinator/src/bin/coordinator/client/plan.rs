//! `coordinator plan` (show, explain, history, trigger, dump-input) and `coordinator audit`.

use clap::Subcommand;
use serde_json::json;
use tessera_coordinator::client::{Retry, assignments_text, layout_text};
use tessera_proto::v1;

use super::{ClientArgs, client, out, print};

#[derive(Subcommand)]
pub(crate) enum PlanCmd {
    /// The committed plan.
    Show {
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Why a GPU has its layout.
    Explain {
        /// GPU id.
        gpu: String,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// A GPU's committed targets, newest first.
    History {
        /// GPU id.
        gpu: String,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Run a planning round now.
    Trigger {
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Print the last round's PlannerInput as JSON (re-plan it with `replay plan --input FILE`).
    DumpInput {
        #[command(flatten)]
        c: ClientArgs,
    },
}

#[derive(Subcommand)]
pub(crate) enum AuditCmd {
    /// List the recorded actions, oldest first.
    List {
        /// Read this member's own copy (may lag the leader) instead of a linearizable read.
        #[arg(long)]
        stale: bool,
        #[command(flatten)]
        c: ClientArgs,
    },
}

/// Runs a `plan` command.
pub(crate) async fn plan(cmd: PlanCmd) -> anyhow::Result<()> {
    match cmd {
        PlanCmd::Show { c } => {
            let r = client(&c)?.call(|mut x| async move { x.get_plan(v1::ListRequest { stale: false }).await }).await?;
            let mut lines = vec![format!(
                "epoch {}  policy {}  made at {} ms  expected goodput {:.1}",
                r.epoch, r.policy, r.made_at_ms, r.expected_goodput
            )];
            let mut gj = Vec::new();
            for g in &r.gpus {
                let p = g.plan.clone().unwrap_or_default();
                lines.push(format!("  {}: [{}]  {}", g.gpu, layout_text(&p.layout), assignments_text(&p.assignments)));
                gj.push(json!({"gpu": g.gpu, "layout": layout_text(&p.layout), "assignments": assignments_text(&p.assignments), "expected_goodput": p.expected_goodput, "explanation": p.explanation}));
            }
            print(
                c.json(),
                json!({"epoch": r.epoch, "policy": r.policy, "made_at_ms": r.made_at_ms, "expected_goodput": r.expected_goodput, "gpus": gj}),
                lines.join("\n"),
            );
            Ok(())
        }
        PlanCmd::Explain { gpu, c } => {
            let r = client(&c)?
                .call(|mut x| {
                    let gpu = gpu.clone();
                    async move { x.explain(v1::GpuRequest { gpu, stale: false }).await }
                })
                .await?;
            let p = r.plan.clone().unwrap_or_default();
            let forecasts: Vec<String> = r.forecasts.iter().map(|(k, v)| format!("{k}={v:.1} rps")).collect();
            print(
                c.json(),
                json!({"gpu": r.gpu, "epoch": r.epoch, "policy": r.policy, "explanation": r.explanation, "layout": layout_text(&p.layout),
                   "assignments": assignments_text(&p.assignments), "status": r.status, "objective": r.objective, "bound": r.bound,
                   "tenants": r.tenants, "forecasts": r.forecasts}),
                format!(
                    "{} at epoch {} ({})\nlayout [{}]  {}\n{}\nsolver: {} objective {:.2} bound {:.2}, {} tenants; forecasts {}",
                    r.gpu,
                    r.epoch,
                    r.policy,
                    layout_text(&p.layout),
                    assignments_text(&p.assignments),
                    r.explanation,
                    if r.status.is_empty() { "(not solved on this leader)" } else { &r.status },
                    r.objective,
                    r.bound,
                    r.tenants,
                    forecasts.join(", ")
                ),
            );
            Ok(())
        }
        PlanCmd::History { gpu, c } => {
            let r = client(&c)?
                .call(|mut x| {
                    let gpu = gpu.clone();
                    async move { x.plan_history(v1::GpuRequest { gpu, stale: false }).await }
                })
                .await?;
            let lines: Vec<String> = r
                .entries
                .iter()
                .map(|e| {
                    let p = e.plan.clone().unwrap_or_default();
                    format!(
                        "epoch {:>5}  {:>10} ms  {:<8} [{}]  {}",
                        e.epoch,
                        e.made_at_ms,
                        e.policy,
                        layout_text(&p.layout),
                        assignments_text(&p.assignments)
                    )
                })
                .collect();
            let js: Vec<_> = r
            .entries
            .iter()
            .map(|e| {
                let p = e.plan.clone().unwrap_or_default();
                json!({"epoch": e.epoch, "made_at_ms": e.made_at_ms, "policy": e.policy, "layout": layout_text(&p.layout), "assignments": assignments_text(&p.assignments)})
            })
            .collect();
            print(
                c.json(),
                json!(js),
                if lines.is_empty() { "(no committed target)".into() } else { lines.join("\n") },
            );
            Ok(())
        }
        PlanCmd::Trigger { c } => {
            let r = client(&c)?
                .call_with(Retry::Once, |mut x| async move { x.trigger_plan(v1::TriggerPlanRequest {}).await })
                .await?;
            print(
                c.json(),
                json!({"outcome": r.outcome, "epoch": r.epoch, "objective": r.objective, "bound": r.bound, "gap": r.gap,
                   "solve_ms": r.solve_ms, "reason": r.reason, "pushed": r.pushed, "push_failures": r.push_failures}),
                format!(
                    "{} epoch {}: objective {:.2} bound {:.2} gap {:.4} in {:.0} ms; pushed {} ({} failed){}",
                    r.outcome,
                    r.epoch,
                    r.objective,
                    r.bound,
                    r.gap,
                    r.solve_ms,
                    r.pushed,
                    r.push_failures,
                    if r.reason.is_empty() { String::new() } else { format!("\n{}", r.reason) }
                ),
            );
            Ok(())
        }
        PlanCmd::DumpInput { c } => {
            let r = client(&c)?
                .call(|mut x| async move { x.dump_planner_input(v1::ListRequest { stale: false }).await })
                .await?;
            out(&r.json);
            Ok(())
        }
    }
}

/// Runs an `audit` command.
pub(crate) async fn audit(cmd: AuditCmd) -> anyhow::Result<()> {
    match cmd {
        AuditCmd::List { stale, c } => {
            let r = client(&c)?.call(|mut x| async move { x.list_audit(v1::ListRequest { stale }).await }).await?;
            let lines: Vec<String> = r
                .entries
                .iter()
                .map(|e| format!("{:>8}  {}  {:<20} {}  -> {}", e.index, e.at_ms, e.who, e.action, e.result))
                .collect();
            let js: Vec<_> = r
            .entries
            .iter()
            .map(|e| json!({"index": e.index, "at_ms": e.at_ms, "who": e.who, "action": e.action, "result": e.result}))
            .collect();
            print(c.json(), json!(js), if lines.is_empty() { "(no audited actions)".into() } else { lines.join("\n") });
            Ok(())
        }
    }
}
