//! `agent mig ...`: the operator's first look at the MIG model. Each function renders one subcommand's output as
//! text (tables for people, one layout per line for scripts) or JSON, from `tessera-core` alone: no GPU needed.

use std::fmt::Write as _;

use serde::Serialize;
use tessera_core::catalog::{COMPUTE_SLICES, GpuModel, MEMORY_SLICES};
use tessera_core::enumerate::{ProfileSet, all_layouts, maximal_layouts, multisets};
use tessera_core::layout::{Layout, LayoutError, LayoutParseError};
use tessera_core::migparted;
use tessera_core::reconfig::{DiffError, ReconfigLatency, ReconfigPlan, StepAction, diff};

/// Why a `mig` subcommand failed; each message is one line naming what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum MigToolError {
    /// Unknown GPU model.
    #[error("--gpu: {0}")]
    Gpu(#[from] tessera_core::catalog::UnknownGpuModel),
    /// A layout argument does not parse.
    #[error("{arg}: {error}")]
    Parse {
        /// Which argument.
        arg: &'static str,
        /// The parse error.
        error: LayoutParseError,
    },
    /// A layout argument is not valid on the model.
    #[error("{arg}: `{layout}` is not a valid {model} layout: {error}")]
    Invalid {
        /// Which argument.
        arg: &'static str,
        /// The layout.
        layout: String,
        /// The model.
        model: GpuModel,
        /// What is wrong.
        error: LayoutError,
    },
    /// A diff could not be computed.
    #[error("{0}")]
    Diff(#[from] DiffError),
    /// A mig-parted file problem.
    #[error("{file}: {error}")]
    MigParted {
        /// The file.
        file: String,
        /// What is wrong.
        error: migparted::MigPartedError,
    },
    /// A file could not be read.
    #[error("{file}: cannot read: {error}")]
    Io {
        /// The file.
        file: String,
        /// The I/O error.
        error: std::io::Error,
    },
}

/// Parses `--gpu`.
pub fn gpu_model(name: &str) -> Result<GpuModel, MigToolError> {
    Ok(name.parse()?)
}

/// Parses and validates a layout argument for `model`.
pub fn layout_arg(arg: &'static str, text: &str, model: GpuModel) -> Result<Layout, MigToolError> {
    let layout = Layout::parse_for(text, Some(model)).map_err(|error| MigToolError::Parse { arg, error })?;
    layout.validate(model).map_err(|error| MigToolError::Invalid {
        arg,
        layout: text.trim().to_string(),
        model,
        error,
    })?;
    Ok(layout)
}

#[derive(Serialize)]
struct ProfileRow {
    id: u32,
    name: &'static str,
    short_name: &'static str,
    max_count: u8,
    compute_slices: u8,
    memory_slices: u8,
    sms: u32,
    copy_engines: u32,
    memory_gib: f64,
    starts: Vec<u8>,
    compute_instances: Vec<String>,
}

/// `agent mig profiles`: the GPU-instance profile table of a model.
pub fn profiles(model: GpuModel, json: bool) -> String {
    let spec = model.spec();
    let rows: Vec<ProfileRow> = spec
        .profiles
        .iter()
        .map(|p| ProfileRow {
            id: p.profile.nvidia_id(),
            name: p.name,
            short_name: p.profile.short_name(),
            max_count: p.max_count,
            compute_slices: p.profile.compute_slices(),
            memory_slices: p.profile.memory_slices(),
            sms: p.sms,
            copy_engines: p.copy_engines,
            memory_gib: p.memory_gib,
            starts: p.profile.allowed_starts().to_vec(),
            compute_instances: p
                .profile
                .compute_instances()
                .iter()
                .map(|c| if c.max_count > 1 { format!("{}x{}", c.name(), c.max_count) } else { c.name() })
                .collect(),
        })
        .collect();
    if json {
        return serde_json::to_string_pretty(&serde_json::json!({
            "model": spec.short_name,
            "product_name": spec.product_name,
            "sms": spec.sms_7g,
            "memory_gib": spec.memory_gib,
            "memory_slices": MEMORY_SLICES,
            "compute_slices": COMPUTE_SLICES,
            "min_driver": spec.min_driver,
            "profiles": rows,
        }))
        .expect("serialisable")
            + "\n";
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} ({}): {} SMs, {:.2} GiB, {MEMORY_SLICES} memory slices, {COMPUTE_SLICES} compute slices, MIG from driver {}",
        spec.short_name, spec.product_name, spec.sms_7g, spec.memory_gib, spec.min_driver
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:>3}  {:<11} {:<6} {:>3}  {:>7} {:>6}  {:>4} {:>3}  {:>7}  {:<14} compute instances",
        "ID", "profile", "short", "max", "compute", "memory", "SMs", "CE", "GiB", "starts"
    );
    for r in &rows {
        let starts: Vec<String> = r.starts.iter().map(u8::to_string).collect();
        let _ = writeln!(
            out,
            "{:>3}  {:<11} {:<6} {:>3}  {:>7} {:>6}  {:>4} {:>3}  {:>7.2}  {:<14} {}",
            r.id,
            r.name,
            r.short_name,
            r.max_count,
            r.compute_slices,
            r.memory_slices,
            r.sms,
            r.copy_engines,
            r.memory_gib,
            starts.join(","),
            r.compute_instances.join(" ")
        );
    }
    out
}

/// Options of `agent mig layouts`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LayoutsOptions {
    /// Only layouts to which nothing more can be added.
    pub maximal: bool,
    /// Include the double-memory 1g profile.
    pub with_double_memory: bool,
    /// Include every profile (the double-memory 1g and `1g+me`).
    pub all_profiles: bool,
    /// Print counts instead of layouts.
    pub count: bool,
    /// Print the model's nvidia-smi profile names instead of short names.
    pub nvidia_names: bool,
    /// JSON output.
    pub json: bool,
}

/// `agent mig layouts`: every valid (or maximal) layout, one per line, or their number.
pub fn layouts(model: GpuModel, o: LayoutsOptions) -> String {
    let set = if o.all_profiles {
        ProfileSet::All
    } else if o.with_double_memory {
        ProfileSet::WithDoubleMemory
    } else {
        ProfileSet::Classic
    };
    let list = if o.maximal { maximal_layouts(model, set) } else { all_layouts(model, set) };
    let kinds = multisets(&list).len();
    let what = if o.maximal { "maximal layouts" } else { "layouts" };
    match (o.count, o.json) {
        (true, true) => format!("{{\"model\":\"{model}\",\"layouts\":{},\"multisets\":{kinds}}}\n", list.len()),
        (true, false) => format!("{} {what}, {kinds} distinct profile multisets\n", list.len()),
        (false, json) => {
            let lines: Vec<String> =
                list.iter().map(|l| if o.nvidia_names { l.display_for(model) } else { l.to_string() }).collect();
            if json {
                serde_json::to_string(&lines).expect("serialisable") + "\n"
            } else {
                lines.iter().map(|l| format!("{l}\n")).collect()
            }
        }
    }
}

/// `agent mig validate`: whether a layout is valid, with a picture of its slices.
pub fn validate(model: GpuModel, layout: &Layout) -> String {
    let mut out = format!(
        "{model}: `{layout}` is valid ({}; {} of {COMPUTE_SLICES} compute slices in use",
        layout.display_for(model),
        layout.compute_slices_used()
    );
    match layout.stranded_compute_slices() {
        0 => out.push_str(")\n"),
        n => {
            let _ = writeln!(out, ", {n} stranded: prefer 3g@4 over 3g@0)");
        }
    }
    let _ = writeln!(out, "memory slices 0-7: {}", layout.slice_map());
    out
}

/// `agent mig diff`: the ordered steps from one layout to another.
pub fn diff_text(
    model: GpuModel,
    from: &Layout,
    to: &Layout,
    latency: &ReconfigLatency,
    json: bool,
) -> Result<String, MigToolError> {
    let plan = diff(model, from, to, latency)?;
    if json {
        return Ok(serde_json::to_string_pretty(&plan).expect("serialisable") + "\n");
    }
    Ok(render_plan(model, from, to, &plan))
}

fn render_plan(model: GpuModel, from: &Layout, to: &Layout, plan: &ReconfigPlan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{model}: {from}  ->  {to}");
    let _ = writeln!(out, "memory slices 0-7: {}  ->  {}", from.slice_map(), to.slice_map());
    if plan.is_noop() {
        let _ = writeln!(out, "nothing to do: the layouts are the same");
        return out;
    }
    let unchanged: Vec<String> = plan.unchanged.iter().map(ToString::to_string).collect();
    let _ = writeln!(
        out,
        "unchanged (keep serving): {}",
        if unchanged.is_empty() { "none".to_string() } else { unchanged.join(" ") }
    );
    let _ = writeln!(out, "steps:");
    for (i, s) in plan.steps.iter().enumerate() {
        let name = model.profile(s.placement.profile).map_or("?", |p| p.name);
        let mut line = format!(
            "  {:>2}. at {:>5.1}s  {:<8} {:<6} ({name}@{})  {:.1}s",
            i + 1,
            s.start_ms as f64 / 1000.0,
            s.action.to_string(),
            s.placement.to_string(),
            s.placement.start,
            s.duration_ms as f64 / 1000.0
        );
        if let (StepAction::Create, Some(ready)) = (s.action, s.ready_ms) {
            let _ = write!(line, ", serving from {:.1}s", ready as f64 / 1000.0);
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let _ = writeln!(
        out,
        "total: {:.1}s until the last new instance serves; {} MIG operations ({} destroy, {} create)",
        plan.total_ms as f64 / 1000.0,
        plan.mig_operations(),
        plan.steps.iter().filter(|s| s.action == StepAction::Destroy).count(),
        plan.steps.iter().filter(|s| s.action == StepAction::Create).count(),
    );
    out
}

/// `agent mig import`: the layouts of a mig-parted file's configurations (or of one) for GPUs of `model`, with
/// explicit placements and where they come from. The file may be the GPU Operator's ConfigMap. With every
/// configuration, those that are not for the model (no device group applies to it, or one names another model's
/// profiles) are listed on a last line; with `--config`, that is an error.
pub fn import(model: GpuModel, file: &str, config: Option<&str>) -> Result<String, MigToolError> {
    let text = std::fs::read_to_string(file).map_err(|error| MigToolError::Io { file: file.to_string(), error })?;
    let err = |error| MigToolError::MigParted { file: file.to_string(), error };
    let parsed = migparted::parse(&text).map_err(err)?;
    let names: Vec<String> = match config {
        Some(c) => vec![c.to_string()],
        None => parsed.mig_configs.keys().cloned().collect(),
    };
    let mut out = String::new();
    let mut elsewhere = Vec::new();
    for name in names {
        let groups = match migparted::import(&parsed, &name, model) {
            Ok(g) => g,
            Err(migparted::MigPartedError::NotForModel { .. } | migparted::MigPartedError::UnknownProfile { .. })
                if config.is_none() =>
            {
                elsewhere.push(name);
                continue;
            }
            Err(e) => return Err(err(e)),
        };
        for g in groups {
            let devices = match &g.devices {
                migparted::Devices::All(_) => "all".to_string(),
                migparted::Devices::List(v) => v.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
            };
            let layout = if g.mig_enabled { g.layout.to_string() } else { "MIG disabled".to_string() };
            let source = match &g.placements {
                migparted::PlacementSource::Nothing => String::new(),
                migparted::PlacementSource::Annotation => "  (placements: the file's tessera.placements line)".into(),
                migparted::PlacementSource::Chosen { ignored: None } => {
                    "  (placements: chosen by Tessera; mig-parted files give counts only)".into()
                }
                migparted::PlacementSource::Chosen { ignored: Some(why) } => {
                    format!("  (placements: chosen by Tessera; the file's tessera.placements line was not used: {why})")
                }
            };
            let _ = writeln!(out, "{name:<20} devices {devices:<8} {layout}{source}");
        }
    }
    if !elsewhere.is_empty() {
        let _ = writeln!(
            out,
            "# not for {model} ({} configurations: no group for its device IDs, or other models' profiles): {}",
            elsewhere.len(),
            elsewhere.join(", ")
        );
    }
    Ok(out)
}

/// `agent mig export`: a mig-parted file applying a layout to every GPU of `model` (see [`migparted::export`]).
pub fn export(model: GpuModel, layout: &Layout, name: &str) -> String {
    migparted::export(name, model, layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_count_for_every_variant() {
        let m = GpuModel::A100_40GB;
        let c = |maximal, with_double_memory| {
            layouts(m, LayoutsOptions { maximal, with_double_memory, count: true, ..Default::default() })
        };
        assert_eq!(c(false, false), "297 layouts, 37 distinct profile multisets\n");
        assert_eq!(c(true, false), "19 maximal layouts, 14 distinct profile multisets\n");
        assert_eq!(c(false, true), "722 layouts, 77 distinct profile multisets\n");
        assert_eq!(c(true, true), "78 maximal layouts, 38 distinct profile multisets\n");
    }

    #[test]
    fn layouts_print_one_per_line() {
        let out = layouts(GpuModel::A100_40GB, LayoutsOptions { maximal: true, ..Default::default() });
        assert_eq!(out.lines().count(), 19);
        assert!(out.lines().any(|l| l == "4g@0 2g@4 1g@6"), "{out}");
        let out =
            layouts(GpuModel::A100_40GB, LayoutsOptions { maximal: true, nvidia_names: true, ..Default::default() });
        assert!(out.lines().any(|l| l == "4g.20gb@0 2g.10gb@4 1g.5gb@6"), "{out}");
    }

    #[test]
    fn diff_renders_steps_in_order() {
        let m = GpuModel::A100_40GB;
        let from = layout_arg("--from", "3g@0 3g@4", m).unwrap();
        let to = layout_arg("--to", "4g@0 2g@4 1g@6", m).unwrap();
        let out = diff_text(m, &from, &to, &ReconfigLatency::default(), false).unwrap();
        let steps: Vec<&str> = out.lines().filter(|l| l.trim_start().starts_with(char::is_numeric)).collect();
        assert_eq!(steps.len(), 5, "{out}");
        assert!(steps[0].contains("destroy  3g@4"), "{out}");
        assert!(out.contains("total: 8.0s"), "{out}");
        let same = diff_text(m, &from, &from, &ReconfigLatency::default(), false).unwrap();
        assert!(same.contains("nothing to do"), "{same}");
    }

    #[test]
    fn bad_arguments_give_one_line_errors() {
        let m = GpuModel::A100_40GB;
        let e = layout_arg("--from", "3g@0 3g@2", m).unwrap_err().to_string();
        assert_eq!(
            e,
            "--from: `3g@0 3g@2` is not a valid A100-40GB layout: 3g@2: 3g can only start at memory slice 0 or 4"
        );
        let e = layout_arg("--to", "3g@0 9g@1", m).unwrap_err().to_string();
        assert!(e.starts_with("--to: bad placement `9g@1`: unknown profile `9g`"), "{e}");
        let e = gpu_model("V100").unwrap_err().to_string();
        assert!(e.starts_with("--gpu: unknown GPU model `V100`"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn profiles_table_lists_every_profile() {
        let out = profiles(GpuModel::H100_80GB, false);
        assert!(out.starts_with("H100-80GB (NVIDIA H100 80GB HBM3): 132 SMs"), "{out}");
        assert_eq!(out.lines().count(), 3 + 7);
        assert!(out.lines().any(|l| l.contains("1g.20gb") && l.contains("0,2,4,6")), "{out}");
        let json: serde_json::Value = serde_json::from_str(&profiles(GpuModel::H100_80GB, true)).unwrap();
        assert_eq!(json["profiles"].as_array().map(Vec::len), Some(7));
    }
}

/// One GPU as `agent mig probe` reports it: the driver's profile table and where it differs from the catalog.
#[derive(Debug, Clone, Serialize)]
pub struct ProbedGpu {
    /// The NVML device index.
    pub index: u32,
    /// The product name.
    pub name: String,
    /// The driver's table, `None` when the backend could not read one.
    pub table: Option<tessera_core::driver::DriverTable>,
    /// Each difference from the catalog, as a sentence.
    pub differences: Vec<String>,
    /// Why the table could not be read, if it could not.
    pub error: Option<String>,
}

/// Reads every GPU's profile table from `backend` (read-only: no MIG mode or instance is changed) and compares it
/// with the catalog: what `agent mig probe` prints, and what `agent run` logs at start.
pub fn probe(backend: &dyn crate::backend::MigBackend) -> Result<Vec<ProbedGpu>, crate::backend::BackendError> {
    Ok(backend
        .gpus()?
        .into_iter()
        .map(|g| match backend.driver_table(g.index) {
            Ok(Some(table)) => ProbedGpu {
                index: g.index,
                name: g.name,
                differences: table.differences().iter().map(ToString::to_string).collect(),
                table: Some(table),
                error: None,
            },
            Ok(None) => ProbedGpu {
                index: g.index,
                name: g.name,
                table: None,
                differences: Vec::new(),
                error: Some("this backend cannot read the driver's table".into()),
            },
            Err(e) => ProbedGpu {
                index: g.index,
                name: g.name,
                table: None,
                differences: Vec::new(),
                error: Some(e.to_string()),
            },
        })
        .collect())
}

/// `agent mig probe`'s JSON.
pub fn probe_json(gpus: &[ProbedGpu]) -> String {
    serde_json::to_string_pretty(&serde_json::json!({ "gpus": gpus })).unwrap_or_default()
}
