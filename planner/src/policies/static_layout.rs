//! `static`: the balanced layout, set once and never reconfigured.
//!
//! **Original.** What most MIG fleets run today: an operator applies a fixed partitioning with NVIDIA's mig-parted
//! (`all-balanced`: two 1g, one 2g and one 3g instance per GPU, NVIDIA mig-parted's example configuration) and
//! the Kubernetes device plugin hands instances to pods. Nothing reacts to load, SLOs or accuracy.
//!
//! **On Tessera.** Every GPU gets the `all-balanced` layout of its model (1g.5gb x2, 2g.10gb, 3g.20gb on an
//! A100-40GB; 1g.10gb x2, 2g.20gb, 3g.40gb on an H100-80GB). Tenants are spread by demand over the fleet, at most
//! four per GPU (one instance each; [`crate::assign::spread`]). On a GPU, the tenant with the largest demand takes
//! the largest instance its model fits and meets its SLO on, and so on down. Instances left over form the
//! retraining pool ([`crate::level2::fixed`]): due retraining jobs run there first come, first served. When no tenant of a
//! GPU retrains at all, left-over instances serve as extra inference replicas for the tenant with the most unmet
//! demand instead, which is what an operator would do with them. Once set, a GPU's layout and instance owners stay
//! as they are for as long as its tenants do ([`crate::level2::fixed::keep_current`]): "never reconfigured".
//!
//! **Parameters.** The mig-parted `all-balanced` counts; four tenants per GPU; nothing else.

use std::collections::BTreeMap;

use tessera_core::ids::{GpuId, TenantId};
use tessera_core::migparted;
use tessera_core::{GpuModel, Layout, Profile};

use crate::assign;
use crate::input::PlannerInput;
use crate::level2::build::{Arrivals, gpu_problem};
use crate::level2::fixed::{self, Fixed};
use crate::level2::problem::{GpuProblem, mean_demand};
use crate::level2::solver::{SolveError, SolveStatus};
use crate::policy::{GpuOutcome, PlanError, PlanOutcome, Policy, plan_fleet};

/// The static policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct StaticLayout;

/// mig-parted's `all-balanced` profile counts.
pub const BALANCED: [(Profile, usize); 3] = [(Profile::G1, 2), (Profile::G2, 1), (Profile::G3, 1)];

/// The `all-balanced` layout of `model`, placed as mig-parted would (fewest stranded slices). Placing walks every
/// layout of the model, so the result is kept per model for the process (a 100-GPU fleet asked for it every round:
/// two thirds of a day-long fluid replay's time).
pub fn balanced_layout(model: GpuModel) -> Layout {
    static PLACED: std::sync::LazyLock<std::sync::Mutex<BTreeMap<GpuModel, Layout>>> =
        std::sync::LazyLock::new(Default::default);
    let mut placed = PLACED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    placed
        .entry(model)
        .or_insert_with(|| {
            let counts: BTreeMap<Profile, usize> = BALANCED.into_iter().collect();
            migparted::place(model, &counts).expect("all-balanced fits every catalogued GPU")
        })
        .clone()
}

impl Policy for StaticLayout {
    fn name(&self) -> &'static str {
        "static"
    }

    fn plan(&self, input: &PlannerInput) -> Result<PlanOutcome, PlanError> {
        let per_gpu: usize = BALANCED.iter().map(|(_, n)| n).sum();
        let l1 = assign::spread(input, per_gpu);
        plan_fleet(self.name(), input, l1, |gpu, tenants| level2(input, gpu, tenants))
    }
}

fn level2(input: &PlannerInput, gpu: &GpuId, tenants: &[TenantId]) -> Result<Option<GpuOutcome>, SolveError> {
    if tenants.is_empty() {
        return Ok(None);
    }
    let pb = gpu_problem(input, gpu, tenants, Arrivals::Point);
    let layout = balanced_layout(pb.gpu);
    let current = &input.gpus[gpu];
    let retrains = tenants.iter().any(|t| input.tenants[t].spec.retraining.is_some());
    let fresh = assign_instances(&pb, &layout, !retrains);
    let fixed = match fixed::keep_current(&pb, current, &fresh) {
        Some(f) if f.layout == layout => f,
        _ => fresh,
    };
    let placed = fixed::run(&pb, &fixed);
    let note = format!("static all-balanced; {}", fixed::describe(&pb, &fixed));
    let objective = crate::level2::evaluate::goodput(&pb, &placed);
    let mut out = GpuOutcome::new(pb, placed, objective, SolveStatus::Rule, note);
    out.fixed_layout = Some(layout);
    Ok(Some(out))
}

/// Largest demand first, each tenant takes the largest free instance it can serve from; with `replicas`, the
/// instances left over go one by one to the tenant with the most unmet demand.
pub fn assign_instances(pb: &GpuProblem, layout: &Layout, replicas: bool) -> Fixed {
    let cap = |i: usize, p: Profile| pb.profile_index(p).map_or(0.0, |k| pb.tenants[i].cap[k]);
    let mut order: Vec<usize> = (0..pb.tenants.len()).collect();
    order.sort_by(|a, b| mean_demand(pb, *b).total_cmp(&mean_demand(pb, *a)).then(a.cmp(b)));
    let mut free: Vec<_> = layout.placements().to_vec();
    // Largest first; ties by start slice.
    free.sort_by(|a, b| b.profile.compute_slices().cmp(&a.profile.compute_slices()).then(a.start.cmp(&b.start)));
    let mut inference = Vec::new();
    for i in order {
        if let Some(k) = free.iter().position(|pl| cap(i, pl.profile) > 0.0) {
            inference.push((free.remove(k), i));
        }
    }
    if replicas {
        while let Some(pl) = free.first().copied() {
            let unmet = |i: usize| {
                let have: f64 = inference.iter().filter(|(_, j)| *j == i).map(|(q, _)| cap(i, q.profile)).sum();
                mean_demand(pb, i) - have
            };
            let best = (0..pb.tenants.len())
                .filter(|i| cap(*i, pl.profile) > 0.0 && unmet(*i) > 0.0)
                .max_by(|a, b| unmet(*a).total_cmp(&unmet(*b)).then(b.cmp(a)));
            free.remove(0);
            if let Some(i) = best {
                inference.push((pl, i));
            }
        }
    }
    Fixed { layout: layout.clone(), inference }
}
