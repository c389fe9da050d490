//! `JobSpec` and `TenantJobs`: how a tenant's jobs run on a real node, as the coordinator API and the agent's
//! `ApplyLayout` carry them.

use tessera_core::jobs::{ContainerRuntime, JobAction, JobMetrics, JobRun, JobSpec, ReadyCheck, Signal, TenantJobs};

use super::ConvertError;
use crate::v1;

impl From<&JobSpec> for v1::JobSpec {
    fn from(j: &JobSpec) -> Self {
        let mut w = v1::JobSpec {
            env: j.env.clone().into_iter().collect(),
            drain_deadline_ms: j.drain_deadline_ms,
            stop_signal: j.stop_signal.to_string(),
            grace_ms: j.grace_ms,
            resume_path: j.resume_path.clone().unwrap_or_default(),
            ..v1::JobSpec::default()
        };
        if let Some(m) = &j.metrics {
            w.metrics_path = m.path.clone();
            w.metrics_counter = m.counter.clone();
            w.metrics_labels = m.labels.clone().into_iter().collect();
        }
        match &j.run {
            JobRun::Command { argv } => w.argv = argv.clone(),
            JobRun::Container { image, args, runtime } => {
                w.image = image.clone();
                w.args = args.clone();
                w.container_runtime = match runtime {
                    ContainerRuntime::Docker => "docker",
                    ContainerRuntime::Podman => "podman",
                }
                .to_string();
            }
        }
        match &j.ready {
            Some(ReadyCheck::Http { path }) => w.ready_http = path.clone(),
            Some(ReadyCheck::Tcp) => w.ready_tcp = true,
            None => {}
        }
        match &j.drain {
            Some(JobAction::Http { path }) => w.drain_http = path.clone(),
            Some(JobAction::Signal { signal }) => w.drain_signal = signal.to_string(),
            None => {}
        }
        match &j.checkpoint {
            Some(JobAction::Http { path }) => w.checkpoint_http = path.clone(),
            Some(JobAction::Signal { signal }) => w.checkpoint_signal = signal.to_string(),
            None => {}
        }
        w
    }
}

fn action(field: &str, http: String, signal: String) -> Result<Option<JobAction>, ConvertError> {
    match (http.is_empty(), signal.is_empty()) {
        (true, true) => Ok(None),
        (false, true) => Ok(Some(JobAction::Http { path: http })),
        (true, false) => Ok(Some(JobAction::Signal {
            signal: signal.parse().map_err(|e: String| ConvertError::new(format!("{field}_signal"), e))?,
        })),
        (false, false) => Err(ConvertError::new(field, "give an HTTP path or a signal, not both")),
    }
}

/// Converts the wire job; its values are checked by [`JobSpec::validate`] where the tenant is validated.
impl TryFrom<v1::JobSpec> for JobSpec {
    type Error = ConvertError;
    fn try_from(w: v1::JobSpec) -> Result<Self, ConvertError> {
        let run = match (w.argv.is_empty(), w.image.is_empty()) {
            (false, true) => JobRun::Command { argv: w.argv },
            (true, false) => JobRun::Container {
                image: w.image,
                args: w.args,
                runtime: if w.container_runtime.is_empty() {
                    ContainerRuntime::Docker
                } else {
                    w.container_runtime.parse().map_err(|e: String| ConvertError::new("container_runtime", e))?
                },
            },
            _ => return Err(ConvertError::new("argv", "give a command (`argv`) or a container `image`, one of them")),
        };
        let ready = match (w.ready_http.is_empty(), w.ready_tcp) {
            (true, false) => None,
            (false, false) => Some(ReadyCheck::Http { path: w.ready_http }),
            (true, true) => Some(ReadyCheck::Tcp),
            (false, true) => return Err(ConvertError::new("ready_http", "give an HTTP path or `ready_tcp`, not both")),
        };
        Ok(JobSpec {
            run,
            env: w.env.into_iter().collect(),
            ready,
            drain: action("drain", w.drain_http, w.drain_signal)?,
            drain_deadline_ms: w.drain_deadline_ms,
            stop_signal: if w.stop_signal.is_empty() {
                Signal::Term
            } else {
                w.stop_signal.parse().map_err(|e: String| ConvertError::new("stop_signal", e))?
            },
            grace_ms: w.grace_ms,
            checkpoint: action("checkpoint", w.checkpoint_http, w.checkpoint_signal)?,
            resume_path: (!w.resume_path.is_empty()).then_some(w.resume_path),
            metrics: (!w.metrics_path.is_empty()).then(|| JobMetrics {
                path: w.metrics_path,
                counter: w.metrics_counter,
                labels: w.metrics_labels.into_iter().collect(),
            }),
        })
    }
}

/// The wire form of a tenant's jobs (its `tenant` left empty: the caller names it where it matters).
impl From<&TenantJobs> for v1::TenantJobs {
    fn from(j: &TenantJobs) -> Self {
        v1::TenantJobs {
            tenant: String::new(),
            serve: j.serve.as_ref().map(Into::into),
            retrain: j.retrain.as_ref().map(Into::into),
        }
    }
}

impl TryFrom<v1::TenantJobs> for TenantJobs {
    type Error = ConvertError;
    fn try_from(w: v1::TenantJobs) -> Result<Self, ConvertError> {
        Ok(TenantJobs {
            serve: w.serve.map(JobSpec::try_from).transpose().map_err(|e| e.within("serve"))?,
            retrain: w.retrain.map(JobSpec::try_from).transpose().map_err(|e| e.within("retrain"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_round_trip_and_bad_wire_values_name_the_field() {
        let mut serve = JobSpec::command(["standin", "serve", "--listen", "127.0.0.1:{port}"]);
        serve.ready = Some(ReadyCheck::Http { path: "/ready".into() });
        serve.drain = Some(JobAction::Http { path: "/drain".into() });
        serve.env.insert("MODEL".into(), "resnet50".into());
        serve.metrics = Some(JobMetrics {
            path: "/metrics".into(),
            counter: "nv_inference_request_success".into(),
            labels: [("model".to_string(), "resnet50".to_string())].into_iter().collect(),
        });
        let mut retrain = JobSpec::command(["standin", "retrain"]);
        retrain.checkpoint = Some(JobAction::Signal { signal: Signal::Usr1 });
        retrain.resume_path = Some("/ckpt/{tenant}.json".into());
        retrain.stop_signal = Signal::Int;
        let jobs = TenantJobs { serve: Some(serve), retrain: Some(retrain) };
        assert_eq!(TenantJobs::try_from(v1::TenantJobs::from(&jobs)), Ok(jobs.clone()));
        let mut container = JobSpec::command(["x"]);
        container.run = JobRun::Container {
            image: "nvcr.io/nvidia/tritonserver:24.05-py3".into(),
            args: vec!["tritonserver".into()],
            runtime: ContainerRuntime::Podman,
        };
        container.ready = Some(ReadyCheck::Tcp);
        assert_eq!(JobSpec::try_from(v1::JobSpec::from(&container)), Ok(container));
        let mut w = v1::TenantJobs::from(&jobs);
        w.retrain.as_mut().unwrap().checkpoint_signal = "SIGSTOP".into();
        assert_eq!(TenantJobs::try_from(w).unwrap_err().field, "retrain.checkpoint_signal");
        let both = v1::JobSpec { argv: vec!["a".into()], image: "i".into(), ..Default::default() };
        assert_eq!(JobSpec::try_from(both).unwrap_err().field, "argv");
    }
}
