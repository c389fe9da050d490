//! The settings of planning rounds, in one place: [`RoundSettings`], read from the coordinator's `[planner]` table
//! and from replay's and the coordinator's flags ([`RoundArgs`]), reported by a running cluster, and turned into
//! the [`PlannerConfig`] a round plans with.
//!
//! Adding a setting is one field of [`RoundSettings`] (its default in `Default`, or [`PlannerConfig`]'s where the
//! planner reads it), one flag of [`RoundArgs`] (its doc line names the default, which a test checks), and its place
//! in [`RoundSettings::planner_config`].

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tessera_core::sharing::Sharing;

use crate::error::InvalidField;
use crate::forecast::ForecasterConfig;
use crate::input::{Placement, PlannerConfig};
use crate::level2::solver::SolverConfig;

/// How planning rounds plan: how often, over which slots, with which forecasts and which solver gap. The same type
/// in the coordinator (its `[planner]` table, with durations as strings: `slot = "10s"`) and in replay (its flags),
/// with one default per setting. Which policy plans is not here: the coordinator names one, replay compares many.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoundSettings {
    /// Time between planning rounds (the planning window). Default 60 s.
    #[serde(with = "humantime_serde")]
    pub plan_every: Duration,
    /// Slot length: the planner's unit of time. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub slot: Duration,
    /// Slots in the planning horizon. Default 12.
    pub horizon_slots: usize,
    /// Share of an instance's SLO throughput that plans may use, in (0, 1]; the rest is headroom for bursts inside a
    /// slot ([`PlannerConfig::target_utilization`]). Default 0.8.
    pub target_utilization: f64,
    /// Relative optimality gap at which each GPU's solve stops, in [0, 1). Default 0.01.
    pub gap: f64,
    /// Incremental rounds: how far a tenant's forecast may move, as a share of its planned band, before its GPU is
    /// solved again; 0 solves every GPU every round ([`PlannerConfig::replan_band`]). Default 1.0.
    pub replan_band: f64,
    /// The forecaster of every tenant: `last`, `ewma` or `seasonal`. Default `ewma`.
    pub forecaster: String,
    /// Also plan inside a window when a slot's measured rates leave the forecast bands by enough to replan the
    /// fleet ([`crate::forecast::burst_calls_replan`]). Default off.
    pub replan_on_burst: bool,
    /// Whether tessera and the perfect-forecast reference may run a tenant's retraining on its own inference
    /// instance ([`Sharing`]). Default `exclusive`.
    pub sharing: Sharing,
    /// Level 1 of every policy but `static` ([`Placement`]). Default `fleet`.
    pub placement: Placement,
}

impl Default for RoundSettings {
    /// The planner's defaults ([`PlannerConfig::default`]) for what it reads, and the loop's own here.
    fn default() -> Self {
        let c = PlannerConfig::default();
        RoundSettings {
            plan_every: Duration::from_secs(60),
            slot: Duration::from_nanos((c.slot_s * 1e9).round() as u64),
            horizon_slots: c.horizon_slots,
            target_utilization: c.target_utilization,
            gap: c.solver.mip_rel_gap,
            replan_band: c.replan_band,
            forecaster: "ewma".into(),
            replan_on_burst: false,
            sharing: c.sharing,
            placement: c.placement,
        }
    }
}

impl RoundSettings {
    /// Checks every setting, naming the bad one by its key (`slot`, `gap`, `forecaster`...).
    pub fn validate(&self) -> Result<(), InvalidField> {
        if self.plan_every.is_zero() {
            return Err(InvalidField::new("plan_every", "must be longer than 0"));
        }
        self.planner_config().validate().map_err(|e| {
            let key = match e.field.as_str() {
                "config.slot_s" => "slot".to_string(),
                "config.solver.mip_rel_gap" => "gap".to_string(),
                other => other.strip_prefix("config.").unwrap_or(other).to_string(),
            };
            InvalidField { field: key, problem: e.problem }
        })?;
        self.forecaster_config()?;
        Ok(())
    }

    /// The planning window, seconds.
    pub fn plan_every_s(&self) -> f64 {
        seconds(self.plan_every)
    }

    /// The configuration a round plans with: these settings, the planner's dead times and solver limits, seed 0.
    pub fn planner_config(&self) -> PlannerConfig {
        PlannerConfig {
            slot_s: seconds(self.slot),
            horizon_slots: self.horizon_slots,
            dead_cold_s: tessera_core::serving::DEAD_COLD_S,
            dead_preinit_s: tessera_core::serving::DEAD_PREINIT_S,
            target_utilization: self.target_utilization,
            solver: SolverConfig { mip_rel_gap: self.gap, ..SolverConfig::default() },
            placement: self.placement,
            sharing: self.sharing,
            seed: 0,
            replan_band: self.replan_band,
        }
    }

    /// The forecaster, built for the slot length (its error names `forecaster`).
    pub fn forecaster_config(&self) -> Result<ForecasterConfig, InvalidField> {
        ForecasterConfig::from_name(&self.forecaster, seconds(self.slot))
    }

    /// The settings that differ between `self` and `other`, each as `key = self's (other's)`, in key order: what a
    /// replay refuses to run against a cluster with.
    pub fn differences(&self, other: &RoundSettings) -> Vec<String> {
        let (Ok(serde_json::Value::Object(mine)), Ok(serde_json::Value::Object(theirs))) =
            (serde_json::to_value(self), serde_json::to_value(other))
        else {
            unreachable!("settings serialise to an object")
        };
        let mut keys: Vec<&String> = mine.keys().collect();
        keys.sort();
        keys.into_iter()
            .filter(|k| mine[*k] != theirs[*k])
            .map(|k| format!("{k} = {} ({})", mine[k], theirs[k]))
            .collect()
    }
}

/// A duration in seconds, as the number of seconds written: nanoseconds / 1e9, one rounding (where
/// [`Duration::as_secs_f64`] adds the fraction to the whole seconds, a second rounding: 4.35 s would be 4.3499...).
pub fn seconds(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e9
}

/// Seconds (`60`, `0.5`) or a duration (`1m`, `90s`, `500ms`).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if let Ok(s) = t.parse::<f64>() {
        // Through whole nanoseconds, so that `seconds` gives back the number written (4.35, not 4.3499999...).
        if !(s.is_finite() && (0.0..1e9).contains(&s)) {
            return Err(format!("`{t}`: expected seconds in [0, 1e9)"));
        }
        return Ok(Duration::from_nanos((s * 1e9).round() as u64));
    }
    humantime::parse_duration(t).map_err(|e| format!("expected seconds (e.g. 60) or a duration (e.g. 1m, 500ms): {e}"))
}

/// The planning flags of `coordinator serve`, `coordinator dev-cluster` and `replay`: each overrides one setting of
/// [`RoundSettings`] (the coordinator's file, or the defaults) when given.
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
#[command(next_help_heading = "Planning")]
pub struct RoundArgs {
    /// Time between planning rounds: seconds (`60`) or a duration (`1m`, `90s`) [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub plan_every: Option<Duration>,
    /// Slot length, the planner's unit of time: seconds (`10`) or a duration (`10s`) [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub slot: Option<Duration>,
    /// Slots in the planning horizon [default: 12].
    #[arg(long = "horizon", alias = "horizon-slots", value_name = "SLOTS")]
    pub horizon_slots: Option<usize>,
    /// Share of an instance's SLO throughput that plans may use, in (0, 1]: the rest is headroom for bursts inside
    /// a slot [default: 0.8].
    #[arg(long, value_name = "SHARE")]
    pub target_utilization: Option<f64>,
    /// Relative optimality gap at which each GPU's solve stops, in [0, 1): larger plans faster and worse (tessera on
    /// 100 GPUs of a synthetic Azure Functions 2019 day: 0.04 planned 1.8x as fast as 0.01 and lost 4.9 % of the
    /// day's goodput; docs/performance.md). The perfect-forecast reference always solves to 1e-4 [default: 0.01].
    #[arg(long, value_name = "GAP")]
    pub gap: Option<f64>,
    /// Incremental rounds: a GPU is solved again only when a tenant's forecast leaves its planned mean widened by
    /// this share of the distance to the planned band's edges (or its tenants, a retraining's state, its health or
    /// instances changed, or its plan's horizon ran out); otherwise it keeps its last plan shifted forward. 0 solves
    /// every GPU every round; tessera and its ablations read it [default: 1].
    #[arg(long, value_name = "SHARE")]
    pub replan_band: Option<f64>,
    /// Forecaster of every tenant: last, ewma or seasonal (a day of slots) [default: ewma].
    #[arg(long, value_name = "NAME")]
    pub forecaster: Option<String>,
    /// Also plan inside a window, at the end of any slot whose arrivals leave the bands of the forecasts the current
    /// plan was made with (rates above twice the band's high edge, by at least 5 % of the fleet's forecast rate in
    /// all): the policy reacts to a burst within a slot instead of at the next window. Every policy but the
    /// perfect-forecast reference (which sees bursts coming).
    #[arg(long)]
    pub replan_on_burst: bool,
    /// Let tessera and the perfect-forecast reference run a tenant's retraining on its own inference instance:
    /// exclusive (never), priority (Tally's block-level priority) or timeslice (TGS-like). The baselines keep their
    /// published behaviour; the upper bound drops its relaxation that charges retraining for slices
    /// [default: exclusive].
    #[arg(long, value_name = "MODE")]
    pub sharing: Option<Sharing>,
    /// Level 1 of every policy but static: fleet (tessera's placement: sticky, memory-aware, demand-balanced), spread
    /// (by demand onto the least-loaded GPU) or round-robin (demand-blind). The same for every policy, so that a
    /// comparison is between the per-GPU policies; vary it to study placement [default: fleet].
    #[arg(long, value_name = "RULE")]
    pub placement: Option<Placement>,
}

impl RoundArgs {
    /// `base` with every setting given here in its place.
    pub fn apply(&self, base: &RoundSettings) -> RoundSettings {
        let mut s = base.clone();
        if let Some(v) = self.plan_every {
            s.plan_every = v;
        }
        if let Some(v) = self.slot {
            s.slot = v;
        }
        if let Some(v) = self.horizon_slots {
            s.horizon_slots = v;
        }
        if let Some(v) = self.target_utilization {
            s.target_utilization = v;
        }
        if let Some(v) = self.gap {
            s.gap = v;
        }
        if let Some(v) = self.replan_band {
            s.replan_band = v;
        }
        if let Some(v) = &self.forecaster {
            s.forecaster = v.clone();
        }
        s.replan_on_burst |= self.replan_on_burst;
        if let Some(v) = self.sharing {
            s.sharing = v;
        }
        if let Some(v) = self.placement {
            s.placement = v;
        }
        s
    }

    /// The defaults with these flags applied, checked (the error names the flag's key).
    pub fn settings(&self) -> Result<RoundSettings, InvalidField> {
        let s = self.apply(&RoundSettings::default());
        s.validate()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        round: RoundArgs,
    }

    #[test]
    fn settings_have_one_default_each_and_name_bad_fields() {
        let d = RoundSettings::default();
        d.validate().unwrap();
        assert_eq!(d.planner_config(), PlannerConfig::default());
        let bad = RoundSettings { forecaster: "crystal-ball".into(), ..d.clone() };
        assert_eq!(bad.validate().unwrap_err().field, "forecaster");
        for (bad, key) in [
            (RoundSettings { horizon_slots: 0, ..d.clone() }, "horizon_slots"),
            (RoundSettings { slot: Duration::ZERO, ..d.clone() }, "slot"),
            (RoundSettings { plan_every: Duration::ZERO, ..d.clone() }, "plan_every"),
            (RoundSettings { gap: 1.0, ..d.clone() }, "gap"),
            (RoundSettings { target_utilization: 1.5, ..d.clone() }, "target_utilization"),
            (RoundSettings { replan_band: -1.0, ..d.clone() }, "replan_band"),
        ] {
            assert_eq!(bad.validate().unwrap_err().field, key);
        }
        let toml: RoundSettings = toml::from_str("slot = \"5s\"\nhorizon_slots = 6\nsharing = \"priority\"\n").unwrap();
        assert_eq!((toml.slot, toml.horizon_slots, toml.sharing), (Duration::from_secs(5), 6, Sharing::Priority));
        assert_eq!(toml.plan_every, d.plan_every);
        let e = toml::from_str::<RoundSettings>("slots = 6\n").unwrap_err().to_string();
        assert!(e.contains("slots"), "{e}");
        // Settings print and read back the same (what a cluster reports, replay reads).
        let back: RoundSettings = serde_json::from_str(&serde_json::to_string(&toml).unwrap()).unwrap();
        assert_eq!(back, toml);
        assert_eq!(
            toml.differences(&d),
            ["horizon_slots = 6 (12)", "sharing = \"priority\" (\"exclusive\")", "slot = \"5s\" (\"10s\")"]
        );
    }

    #[test]
    fn flags_override_only_what_they_name() {
        let args =
            Cli::try_parse_from(["x", "--slot", "5", "--plan-every", "2m", "--horizon-slots", "6"]).unwrap().round;
        let base = RoundSettings { gap: 0.05, ..RoundSettings::default() };
        let s = args.apply(&base);
        assert_eq!(
            (s.slot, s.plan_every, s.horizon_slots, s.gap),
            (Duration::from_secs(5), Duration::from_secs(120), 6, 0.05)
        );
        assert_eq!(Cli::try_parse_from(["x"]).unwrap().round.apply(&base), base);
        assert!(Cli::try_parse_from(["x", "--slot", "soon"]).is_err());
        // A number of seconds comes back as written.
        for text in ["4.35", "0.1", "59.9", "12.345"] {
            let slot = Cli::try_parse_from(["x", "--slot", text]).unwrap().round.slot.unwrap();
            assert_eq!(seconds(slot), text.parse::<f64>().unwrap(), "{text}");
        }
        let e = Cli::try_parse_from(["x", "--gap", "2"]).unwrap().round.settings().unwrap_err();
        assert_eq!(e.field, "gap");
    }

    /// Every flag's help names its default, and the defaults named are [`RoundSettings::default`]'s: flags given
    /// those values change nothing.
    #[test]
    fn the_documented_defaults_are_the_defaults() {
        let command = Cli::command();
        let mut argv = vec!["x".to_string()];
        for arg in command.get_arguments().filter(|a| a.get_long().is_some_and(|l| l != "help")) {
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
                continue;
            }
            let default = help
                .rsplit_once("[default: ")
                .and_then(|(_, rest)| rest.strip_suffix(']'))
                .unwrap_or_else(|| panic!("--{}'s help names no default: {help}", arg.get_long().unwrap()));
            argv.push(format!("--{}", arg.get_long().unwrap()));
            argv.push(default.to_string());
        }
        assert!(argv.len() > 15, "{argv:?}");
        let documented = Cli::try_parse_from(&argv).unwrap().round;
        let d = RoundSettings::default();
        assert_eq!(documented.apply(&RoundSettings { horizon_slots: 1, ..d.clone() }), d);
    }
}
