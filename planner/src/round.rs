//! One planning round, as the coordinator's leader and replay both run it: the state a planner keeps from one round
//! to the next (the settings are [`crate::settings::RoundSettings`]).
//!
//! A round reads the fleet's live state (each GPU's layout and assignments, each tenant's accuracy and retraining
//! progress), asks each tenant's forecaster for the horizon, hands every GPU the warm start the previous plan left
//! it, and assembles the [`PlannerInput`]; once the policy has planned, the plan's warm starts are kept for the
//! next round and its forecasts for the burst rule ([`Rounds::burst_calls_replan`]), which decides whether a
//! slot's measured rates call a replan before the next window. Where the rates come from is the caller's business:
//! replay measures them from the trace, the coordinator from what agents report.
//!
//! Pure: no clock, no I/O. The same calls in the same order give the same inputs, which is why replay's
//! in-process runs and its runs through a coordinator cluster plan alike.

use std::collections::BTreeMap;

use tessera_core::ids::{GpuId, TenantId};
use tessera_core::model::ModelProfile;
use tessera_core::time::SimTime;

use crate::forecast::{Forecast, Forecaster, ForecasterConfig, burst_calls_replan};
use crate::input::{GpuInput, Interference, PlannerConfig, PlannerInput, TenantInput, WarmStart};
use crate::policy::PlanReport;

/// What a round reads about one tenant besides its forecast.
#[derive(Debug, Clone)]
pub struct TenantState {
    /// The tenant's spec.
    pub spec: tessera_core::tenant::TenantSpec,
    /// Accuracy of the model serving it now.
    pub accuracy: f64,
    /// Whether a retraining is due or under way.
    pub retraining_due: bool,
    /// Retraining work done so far, 7g GPU-seconds.
    pub retraining_done_gpu_s: f64,
    /// Epochs of the retraining due, where a plan chose other than the spec's ([`TenantInput::retraining_epochs`]).
    pub retraining_epochs: Option<f64>,
    /// The true arrival rates of the horizon, given only to a policy that sees the truth.
    pub actual: Option<Vec<f64>>,
}

/// The forecasts a plan was made with: what the burst rule compares measured rates against.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// Workload time of the round.
    pub at: SimTime,
    /// The forecast each tenant was planned with.
    pub forecasts: BTreeMap<TenantId, Forecast>,
}

/// What a planner keeps from one round to the next: a forecaster per tenant, the warm start each GPU's last plan
/// left, and the forecasts the last round was made with; and the interference table every round is given.
pub struct Rounds {
    forecaster: ForecasterConfig,
    forecasters: BTreeMap<TenantId, (Box<dyn Forecaster>, usize)>,
    warm: BTreeMap<GpuId, WarmStart>,
    planned: Option<Planned>,
    interference: Option<Interference>,
}

impl Rounds {
    /// No round yet; each tenant's forecaster is built from `forecaster` when first seen.
    pub fn new(forecaster: ForecasterConfig) -> Rounds {
        Rounds { forecaster, forecasters: BTreeMap::new(), warm: BTreeMap::new(), planned: None, interference: None }
    }

    /// Gives every later round's input this interference table (`None`: plan as if co-located tenants did not
    /// slow each other down).
    pub fn set_interference(&mut self, interference: Option<Interference>) {
        self.interference = interference;
    }

    /// The interference table every round is given.
    pub fn interference(&self) -> Option<&Interference> {
        self.interference.as_ref()
    }

    /// Feeds `tenant`'s forecaster the rate measured over the next slot (requests per second).
    pub fn observe(&mut self, tenant: &TenantId, rate_rps: f64) {
        let (f, n) = self.forecasters.entry(tenant.clone()).or_insert_with(|| (self.forecaster.build(), 0));
        f.observe(rate_rps);
        *n += 1;
    }

    /// How many rates `tenant`'s forecaster has been fed.
    pub fn observations(&self, tenant: &TenantId) -> usize {
        self.forecasters.get(tenant).map_or(0, |(_, n)| *n)
    }

    /// Drops every warm start (a new leader plans its first round cold).
    pub fn forget_warm_starts(&mut self) {
        self.warm.clear();
    }

    /// The input of a round at `now` with epoch `epoch`: `gpus` as they are, and each tenant of `tenants` with its
    /// forecaster's forecast over `config.horizon_slots` slots (a flat `unknown_rps` for a tenant no rate was fed
    /// for). Each GPU gets the warm start the last plan left it, once. The forecasts are kept for the burst rule.
    #[allow(clippy::too_many_arguments)]
    pub fn input(
        &mut self,
        epoch: u64,
        now: SimTime,
        config: PlannerConfig,
        models: BTreeMap<String, ModelProfile>,
        gpus: impl IntoIterator<Item = (GpuId, GpuInput)>,
        tenants: impl IntoIterator<Item = TenantState>,
        unknown_rps: f64,
    ) -> PlannerInput {
        let horizon = config.horizon_slots;
        // Each warm start is used once: the next planned round leaves the next ones.
        let mut warm = std::mem::take(&mut self.warm);
        let gpus = gpus
            .into_iter()
            .map(|(id, mut g)| {
                g.warm = warm.remove(&id);
                (id, g)
            })
            .collect();
        let mut forecasts = BTreeMap::new();
        let tenants = tenants
            .into_iter()
            .map(|t| {
                let forecast = match self.forecasters.get(&t.spec.id) {
                    Some((f, _)) => f.forecast(horizon),
                    None => Forecast::flat(unknown_rps, horizon),
                };
                forecasts.insert(t.spec.id.clone(), forecast.clone());
                let input = TenantInput {
                    spec: t.spec,
                    forecast,
                    actual: t.actual,
                    accuracy: t.accuracy,
                    retraining_due: t.retraining_due,
                    retraining_done_gpu_s: t.retraining_done_gpu_s,
                    retraining_epochs: t.retraining_epochs,
                };
                (input.spec.id.clone(), input)
            })
            .collect();
        self.planned = Some(Planned { at: now, forecasts });
        PlannerInput { epoch, now, config, models, gpus, tenants, interference: self.interference.clone() }
    }

    /// Keeps what a planned round leaves the next: each GPU's warm start (`None`, an infeasible or abandoned
    /// round, leaves none).
    pub fn planned(&mut self, report: Option<&PlanReport>) {
        self.warm = report.map(|r| r.warm_starts()).unwrap_or_default();
    }

    /// The forecasts the last round was made with.
    pub fn last_forecasts(&self) -> Option<&Planned> {
        self.planned.as_ref()
    }

    /// Whether the rates measured in slot `k` of the last round (0: its first slot) call a replan: they leave the
    /// bands of the forecasts that round was made with by enough to replan the fleet ([`burst_calls_replan`]).
    /// `rate` gives a tenant's measured rate (`None`: nothing measured). Before any round, nothing does.
    pub fn burst_calls_replan(&self, k: usize, rate: impl Fn(&TenantId) -> Option<f64>) -> bool {
        let Some(planned) = &self.planned else { return false };
        burst_calls_replan(planned.forecasts.iter().map(|(t, fc)| (fc, rate(t))), k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::{SyntheticSpec, input as synthetic};

    fn models() -> BTreeMap<String, ModelProfile> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models");
        tessera_core::config::load_model_dir(&dir).expect("shipped models load")
    }

    #[test]
    fn a_round_hands_each_warm_start_out_once_and_keeps_its_forecasts() {
        let spec =
            SyntheticSpec { gpus: 2, tenants: 4, slots: 6, gpu_model: tessera_core::GpuModel::A100_40GB, seed: 3 };
        let first = synthetic(&spec, &models(), PlannerConfig::default());
        let config = first.config.clone();
        let mut rounds = Rounds::new(ForecasterConfig::from_name("ewma", config.slot_s).unwrap());
        let state = |input: &PlannerInput| -> Vec<TenantState> {
            input
                .tenants
                .values()
                .map(|t| TenantState {
                    spec: t.spec.clone(),
                    accuracy: t.accuracy,
                    retraining_due: t.retraining_due,
                    retraining_done_gpu_s: t.retraining_done_gpu_s,
                    retraining_epochs: t.retraining_epochs,
                    actual: None,
                })
                .collect()
        };
        let ids: Vec<TenantId> = first.tenants.keys().cloned().collect();
        rounds.observe(&ids[0], 40.0);
        assert_eq!((rounds.observations(&ids[0]), rounds.observations(&ids[1])), (1, 0));
        let gpus = first.gpus.clone();
        let input =
            rounds.input(1, SimTime::ZERO, config.clone(), first.models.clone(), gpus.clone(), state(&first), 2.5);
        assert_eq!(input.tenants[&ids[0]].forecast.mean, vec![40.0; 6]);
        assert_eq!(input.tenants[&ids[1]].forecast, Forecast::flat(2.5, 6));
        assert!(input.gpus.values().all(|g| g.warm.is_none()));
        assert_eq!(rounds.last_forecasts().unwrap().forecasts.len(), ids.len());

        let outcome = crate::policies::by_name("tessera").unwrap().plan(&input).unwrap();
        rounds.planned(outcome.report());
        let again = rounds.input(
            2,
            SimTime::from_ms(60_000),
            config.clone(),
            first.models.clone(),
            gpus.clone(),
            state(&first),
            2.5,
        );
        assert!(again.gpus.values().filter(|g| g.warm.is_some()).count() > 0, "the plan's warm starts are handed out");
        let third = rounds.input(3, SimTime::from_ms(120_000), config, first.models.clone(), gpus, state(&first), 2.5);
        assert!(third.gpus.values().all(|g| g.warm.is_none()), "each warm start is used once");

        // The burst rule: a measured rate far above the band of a forecast that carries the fleet calls a replan.
        assert!(!rounds.burst_calls_replan(0, |_| None));
        assert!(rounds.burst_calls_replan(0, |t| (t == &ids[0]).then_some(4000.0)));
    }
}
