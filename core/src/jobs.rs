//! How a tenant's work runs on a real node: its `serve` and `retrain` jobs.
//!
//! A tenant may carry a [`TenantJobs`]: for each role, a [`JobSpec`] saying what to start on an instance (a command,
//! or a container image run through the Docker or Podman CLI), its environment, how to tell it is ready, how to
//! drain it, how to stop it, and for retraining how to checkpoint it and where it resumes from. The agent's job
//! supervisor starts the job on the instance the plan gives the tenant, with the instance's MIG UUID in
//! `CUDA_VISIBLE_DEVICES`. A tenant without jobs keeps bookkeeping only: the operator's own system follows the
//! agent's state.
//!
//! ## Templates
//! Every string of a job (argv, image arguments, environment values, the resume path) may name these, written
//! `{name}` (`{{` and `}}` for literal braces): [`TEMPLATE_VARIABLES`]: `tenant`, `role` (`serve` or `retrain`),
//! `node`, `gpu` (the NVML index), `profile` (`3g`), `placement` (`3g@4`), `mig_uuid` (`MIG-...`), `port` (a port
//! the agent allocated to this job on this instance) and `checkpoint` (the expanded resume path). An unknown name
//! is an error naming the field, when the tenant is created, not when the job starts.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The names a job's templates may use.
pub const TEMPLATE_VARIABLES: [&str; 9] =
    ["tenant", "role", "node", "gpu", "profile", "placement", "mig_uuid", "port", "checkpoint"];

/// Longest argv, environment or argument list accepted.
pub const MAX_JOB_ITEMS: usize = 256;
/// Longest single string accepted in a job, bytes.
pub const MAX_JOB_STRING_BYTES: usize = 4096;
/// Longest drain deadline or stop grace accepted, ms (one hour).
pub const MAX_JOB_WAIT_MS: u64 = 3_600_000;
/// Default drain deadline, ms.
pub const DEFAULT_DRAIN_DEADLINE_MS: u64 = 30_000;
/// Default grace between the stop signal and `SIGKILL`, ms.
pub const DEFAULT_GRACE_MS: u64 = 10_000;

/// A tenant's jobs, by role.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantJobs {
    /// What serves the tenant's inference on an inference instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<JobSpec>,
    /// What retrains the tenant's model on a retraining instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retrain: Option<JobSpec>,
}

impl TenantJobs {
    /// Whether the tenant has no job (bookkeeping only).
    pub fn is_empty(&self) -> bool {
        self.serve.is_none() && self.retrain.is_none()
    }

    /// Checks both jobs (fields named `serve.…` and `retrain.…`).
    pub fn validate(&self) -> Result<(), JobError> {
        if let Some(s) = &self.serve {
            s.validate().map_err(|e| e.within("serve"))?;
            if s.checkpoint.is_some() {
                return Err(JobError::new("serve.checkpoint", "only a retrain job checkpoints"));
            }
        }
        if let Some(r) = &self.retrain {
            r.validate().map_err(|e| e.within("retrain"))?;
            if r.metrics.is_some() {
                return Err(JobError::new("retrain.metrics", "only a serve job counts requests"));
            }
        }
        Ok(())
    }
}

/// What a job runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobRun {
    /// A process: argv\[0\] is looked up on the agent's `PATH`.
    Command {
        /// The argument vector.
        argv: Vec<String>,
    },
    /// A container, through a container CLI (`docker run` or `podman run`) with the instance as its one GPU.
    Container {
        /// The image.
        image: String,
        /// Arguments after the image.
        args: Vec<String>,
        /// The CLI: `docker` or `podman`.
        runtime: ContainerRuntime,
    },
}

/// A container CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerRuntime {
    /// `docker run --gpus device=MIG-...`.
    Docker,
    /// `podman run --device nvidia.com/gpu=MIG-...` (CDI).
    Podman,
}

impl FromStr for ContainerRuntime {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "docker" => Ok(ContainerRuntime::Docker),
            "podman" => Ok(ContainerRuntime::Podman),
            _ => Err(format!("`{s}`: expected `docker` or `podman`")),
        }
    }
}

/// How the supervisor tells a job is ready (it reports the instance serving only then).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadyCheck {
    /// `GET http://127.0.0.1:{port}{path}` answers 2xx.
    Http {
        /// The path, starting with `/`.
        path: String,
    },
    /// A TCP connection to the job's port succeeds.
    Tcp,
}

/// A Unix signal a job may be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Signal {
    /// `SIGTERM`.
    Term,
    /// `SIGINT`.
    Int,
    /// `SIGHUP`.
    Hup,
    /// `SIGQUIT`.
    Quit,
    /// `SIGUSR1`.
    Usr1,
    /// `SIGUSR2`.
    Usr2,
    /// `SIGKILL` (cannot be handled: no drain, no checkpoint).
    Kill,
}

impl Signal {
    /// Every signal, by name.
    pub const ALL: [Signal; 7] =
        [Signal::Term, Signal::Int, Signal::Hup, Signal::Quit, Signal::Usr1, Signal::Usr2, Signal::Kill];

    /// The name, `SIGTERM`.
    pub const fn name(self) -> &'static str {
        match self {
            Signal::Term => "SIGTERM",
            Signal::Int => "SIGINT",
            Signal::Hup => "SIGHUP",
            Signal::Quit => "SIGQUIT",
            Signal::Usr1 => "SIGUSR1",
            Signal::Usr2 => "SIGUSR2",
            Signal::Kill => "SIGKILL",
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Signal {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let upper = s.trim().to_ascii_uppercase();
        let name = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
        Signal::ALL.into_iter().find(|sig| sig.name() == name).ok_or_else(|| {
            format!("`{s}`: expected one of SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGKILL")
        })
    }
}

crate::string_serde!(Signal);

/// An action the supervisor takes on a job: an HTTP call to its port, or a signal to its process group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobAction {
    /// `POST http://127.0.0.1:{port}{path}`; the action is done when it answers 2xx.
    Http {
        /// The path, starting with `/`.
        path: String,
    },
    /// A signal to the job's process group.
    Signal {
        /// The signal.
        signal: Signal,
    },
}

/// One job: see the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// What runs.
    pub run: JobRun,
    /// Extra environment (`CUDA_VISIBLE_DEVICES` is the supervisor's and cannot be set here).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// How readiness is checked; `None`: ready once started.
    #[serde(default)]
    pub ready: Option<ReadyCheck>,
    /// How the job is drained before it stops (in-flight requests finish); `None`: no drain, straight to the stop.
    #[serde(default)]
    pub drain: Option<JobAction>,
    /// How long a drain may take before the job is stopped anyway, ms.
    #[serde(default = "default_drain_deadline")]
    pub drain_deadline_ms: u64,
    /// The signal that stops the job.
    #[serde(default = "default_stop_signal")]
    pub stop_signal: Signal,
    /// How long after the stop signal the job's process group is killed, ms.
    #[serde(default = "default_grace")]
    pub grace_ms: u64,
    /// How a retraining job is told to checkpoint before it stops; `None`: its stop signal checkpoints.
    #[serde(default)]
    pub checkpoint: Option<JobAction>,
    /// Where a retraining job resumes from (a template; `{checkpoint}` in the job's strings expands to it).
    #[serde(default)]
    pub resume_path: Option<String>,
    /// Where a serve job counts its requests (Prometheus text on its port): the agent reads the counter and
    /// reports the tenant's arrivals from it, so that the coordinator forecasts from the real load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<JobMetrics>,
}

/// A serve job's request counter: `GET http://127.0.0.1:{port}{path}`, the samples of `counter` (with `labels`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobMetrics {
    /// The path, starting with `/` (`/metrics`).
    pub path: String,
    /// The counter's sample name (Triton: `nv_inference_request_success`; vLLM: `vllm:request_success_total`).
    pub counter: String,
    /// Only samples with these labels count.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

fn default_drain_deadline() -> u64 {
    DEFAULT_DRAIN_DEADLINE_MS
}
fn default_stop_signal() -> Signal {
    Signal::Term
}
fn default_grace() -> u64 {
    DEFAULT_GRACE_MS
}

/// A job field that fails validation, or a template that cannot expand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {message}")]
pub struct JobError {
    /// Dotted path of the field (`serve.argv[2]`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl JobError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> JobError {
        JobError { field: field.into(), message: message.into() }
    }

    /// The same error under `prefix`.
    pub fn within(self, prefix: &str) -> JobError {
        JobError { field: format!("{prefix}.{}", self.field), message: self.message }
    }
}

impl JobSpec {
    /// A command job with defaults for everything else.
    pub fn command(argv: impl IntoIterator<Item = impl Into<String>>) -> JobSpec {
        JobSpec {
            run: JobRun::Command { argv: argv.into_iter().map(Into::into).collect() },
            env: BTreeMap::new(),
            ready: None,
            drain: None,
            drain_deadline_ms: DEFAULT_DRAIN_DEADLINE_MS,
            stop_signal: Signal::Term,
            grace_ms: DEFAULT_GRACE_MS,
            checkpoint: None,
            resume_path: None,
            metrics: None,
        }
    }

    /// Every template string of the job with its field name.
    fn templates(&self) -> Vec<(String, &str)> {
        let mut out = Vec::new();
        match &self.run {
            JobRun::Command { argv } => {
                out.extend(argv.iter().enumerate().map(|(i, a)| (format!("argv[{i}]"), a.as_str())));
            }
            JobRun::Container { image, args, .. } => {
                out.push(("image".to_string(), image.as_str()));
                out.extend(args.iter().enumerate().map(|(i, a)| (format!("args[{i}]"), a.as_str())));
            }
        }
        out.extend(self.env.iter().map(|(k, v)| (format!("env.{k}"), v.as_str())));
        if let Some(p) = &self.resume_path {
            out.push(("resume_path".to_string(), p.as_str()));
        }
        out
    }

    /// Checks the job: a non-empty argv or image, bounded sizes, known template names, HTTP paths that start with
    /// `/`, bounded waits, environment names that are names (and not `CUDA_VISIBLE_DEVICES`).
    pub fn validate(&self) -> Result<(), JobError> {
        match &self.run {
            JobRun::Command { argv } => {
                if argv.is_empty() || argv[0].trim().is_empty() {
                    return Err(JobError::new("argv", "must name a program"));
                }
                if argv.len() > MAX_JOB_ITEMS {
                    return Err(JobError::new("argv", format!("at most {MAX_JOB_ITEMS} arguments")));
                }
            }
            JobRun::Container { image, args, .. } => {
                if image.trim().is_empty() {
                    return Err(JobError::new("image", "must name an image"));
                }
                if args.len() > MAX_JOB_ITEMS {
                    return Err(JobError::new("args", format!("at most {MAX_JOB_ITEMS} arguments")));
                }
            }
        }
        if self.env.len() > MAX_JOB_ITEMS {
            return Err(JobError::new("env", format!("at most {MAX_JOB_ITEMS} variables")));
        }
        for name in self.env.keys() {
            let field = format!("env.{name}");
            if name.is_empty()
                || name.starts_with(|c: char| c.is_ascii_digit())
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return Err(JobError::new(field, "not an environment variable name (letters, digits, `_`)"));
            }
            if name == "CUDA_VISIBLE_DEVICES" || name == "NVIDIA_VISIBLE_DEVICES" || name.starts_with("TESSERA_") {
                return Err(JobError::new(field, "is set by the agent (the instance's MIG UUID, the job's identity)"));
            }
            // They would choose which program runs, or what it loads, past the node's allow list.
            if name == "PATH" || name.starts_with("LD_") {
                return Err(JobError::new(field, "may not be set: it would change which program or library runs"));
            }
        }
        for (field, text) in self.templates() {
            if text.len() > MAX_JOB_STRING_BYTES {
                return Err(JobError::new(field, format!("at most {MAX_JOB_STRING_BYTES} bytes")));
            }
            template_names(text).map_err(|m| JobError::new(field.clone(), m.to_string()))?;
        }
        let path_ok = |field: &str, p: &str| {
            if p.starts_with('/') && p.len() <= MAX_JOB_STRING_BYTES && !p.chars().any(char::is_whitespace) {
                Ok(())
            } else {
                Err(JobError::new(field, format!("`{p}`: an HTTP path starts with `/` and has no spaces")))
            }
        };
        if let Some(ReadyCheck::Http { path }) = &self.ready {
            path_ok("ready.http", path)?;
        }
        if let Some(JobAction::Http { path }) = &self.drain {
            path_ok("drain.http", path)?;
        }
        if let Some(JobAction::Http { path }) = &self.checkpoint {
            path_ok("checkpoint.http", path)?;
        }
        if let Some(m) = &self.metrics {
            path_ok("metrics.path", &m.path)?;
            if m.counter.is_empty() || m.counter.len() > 256 || m.counter.chars().any(char::is_whitespace) {
                return Err(JobError::new("metrics.counter", "a counter's sample name, 1 to 256 bytes, no spaces"));
            }
            if m.labels.len() > 32 {
                return Err(JobError::new("metrics.labels", "at most 32 labels"));
            }
        }
        for (field, ms) in [("drain.deadline", self.drain_deadline_ms), ("stop.grace", self.grace_ms)] {
            if ms > MAX_JOB_WAIT_MS {
                return Err(JobError::new(field, format!("{ms} ms; at most one hour")));
            }
        }
        Ok(())
    }
}

/// A template that is malformed, names an unknown variable, or one without a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A `}` that closes nothing.
    #[error("`{text}`: a lone `}}` (write `}}}}` for a literal brace)")]
    LoneClose {
        /// The template.
        text: String,
    },
    /// A `{` that is never closed.
    #[error("`{text}`: `{{` without its `}}`")]
    Unclosed {
        /// The template.
        text: String,
    },
    /// A name that is not a template variable.
    #[error("`{text}`: unknown template variable `{{{name}}}` (known: {})", TEMPLATE_VARIABLES.join(", "))]
    Unknown {
        /// The template.
        text: String,
        /// The name.
        name: String,
    },
    /// A variable with no value where the template is expanded.
    #[error("`{text}`: no value for `{{{name}}}`")]
    NoValue {
        /// The template.
        text: String,
        /// The name.
        name: String,
    },
}

/// The names a template uses, or why it is malformed or names an unknown variable.
fn template_names(text: &str) -> Result<Vec<&str>, TemplateError> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(['{', '}']) {
        let after = &rest[i + 1..];
        if rest[i..].starts_with("{{") || rest[i..].starts_with("}}") {
            rest = &rest[i + 2..];
            continue;
        }
        if rest.as_bytes()[i] == b'}' {
            return Err(TemplateError::LoneClose { text: text.to_string() });
        }
        let end = after.find('}').ok_or_else(|| TemplateError::Unclosed { text: text.to_string() })?;
        let name = &after[..end];
        if !TEMPLATE_VARIABLES.contains(&name) {
            return Err(TemplateError::Unknown { text: text.to_string(), name: name.to_string() });
        }
        names.push(name);
        rest = &after[end + 1..];
    }
    Ok(names)
}

/// Expands `{name}` in `text` from `vars` (`{{` and `}}` are literal braces). A name `vars` lacks is an error.
pub fn expand(text: &str, vars: &BTreeMap<&str, String>) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        if rest[i..].starts_with("{{") || rest[i..].starts_with("}}") {
            out.push(rest.as_bytes()[i] as char);
            rest = &rest[i + 2..];
            continue;
        }
        if rest.as_bytes()[i] == b'}' {
            return Err(TemplateError::LoneClose { text: text.to_string() });
        }
        let after = &rest[i + 1..];
        let end = after.find('}').ok_or_else(|| TemplateError::Unclosed { text: text.to_string() })?;
        let name = &after[..end];
        let value =
            vars.get(name).ok_or_else(|| TemplateError::NoValue { text: text.to_string(), name: name.to_string() })?;
        out.push_str(value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_expand_and_unknown_names_are_refused_with_the_field() {
        let vars: BTreeMap<&str, String> =
            [("port", "9001".to_string()), ("mig_uuid", "MIG-1".to_string())].into_iter().collect();
        assert_eq!(expand("--listen=127.0.0.1:{port} {{x}}", &vars).unwrap(), "--listen=127.0.0.1:9001 {x}");
        assert!(expand("{tenant}", &vars).unwrap_err().to_string().contains("no value for `{tenant}`"));
        let mut job = JobSpec::command(["server", "--port", "{port}", "--dev={mig_uuid}"]);
        assert_eq!(job.validate(), Ok(()));
        job.run = JobRun::Command { argv: vec!["server".into(), "--model={modle}".into()] };
        let e = job.validate().unwrap_err();
        assert_eq!(e.field, "argv[1]");
        assert!(e.message.contains("unknown template variable `{modle}`"), "{e}");
        job.run = JobRun::Command { argv: vec!["server".into(), "{port".into()] };
        assert!(job.validate().unwrap_err().message.contains("without its"));
    }

    #[test]
    fn a_job_is_checked_field_by_field() {
        let mut jobs = TenantJobs { serve: Some(JobSpec::command(["s"])), retrain: None };
        assert_eq!(jobs.validate(), Ok(()));
        jobs.serve.as_mut().unwrap().env.insert("CUDA_VISIBLE_DEVICES".into(), "0".into());
        assert_eq!(jobs.validate().unwrap_err().field, "serve.env.CUDA_VISIBLE_DEVICES");
        for name in ["PATH", "LD_PRELOAD", "TESSERA_JOB_ID"] {
            let mut s = JobSpec::command(["s"]);
            s.env.insert(name.into(), "x".into());
            assert_eq!(s.validate().unwrap_err().field, format!("env.{name}"));
        }
        let mut s = JobSpec::command(["s"]);
        s.ready = Some(ReadyCheck::Http { path: "ready".into() });
        assert_eq!(s.validate().unwrap_err().field, "ready.http");
        let mut s = JobSpec::command(["s"]);
        s.grace_ms = MAX_JOB_WAIT_MS + 1;
        assert_eq!(s.validate().unwrap_err().field, "stop.grace");
        let mut s = JobSpec::command(Vec::<String>::new());
        assert_eq!(s.validate().unwrap_err().field, "argv");
        s.checkpoint = Some(JobAction::Signal { signal: Signal::Usr1 });
        s.run = JobRun::Command { argv: vec!["s".into()] };
        let jobs = TenantJobs { serve: Some(s), retrain: None };
        assert_eq!(jobs.validate().unwrap_err().field, "serve.checkpoint");
    }

    #[test]
    fn signals_parse_with_or_without_the_prefix() {
        assert_eq!("SIGTERM".parse::<Signal>(), Ok(Signal::Term));
        assert_eq!("usr1".parse::<Signal>(), Ok(Signal::Usr1));
        assert!("SIGSTOP".parse::<Signal>().is_err());
        let json = serde_json::to_string(&JobSpec::command(["a"])).unwrap();
        let back: JobSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, JobSpec::command(["a"]));
    }
}
