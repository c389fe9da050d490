//! Alibaba GPU-sharing trace 2023 (Weng et al., ATC 2023): one row per pod, `name,cpu_milli,memory_mib,num_gpu,
//! gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time`, times in seconds from the trace
//! start (from 0 to [`MAX_TRACE_TIME_S`](super::reader::MAX_TRACE_TIME_S)).
//!
//! Pods carry no requests, so the mapping is ours: each GPU pod is a stream active over its lifetime whose requests
//! form a Poisson process of rate `pod_rps_per_gpu * num_gpu * gpu_milli / 1000` (a pod holding half a GPU sends
//! half the traffic of a whole-GPU pod). The count in the window is drawn here (pass 1), from the pod's own seeded
//! generator, so [`super::StreamStats::requests`] is exact; pass 2 places that many sorted uniform points over the
//! pod's active interval (a Poisson process conditioned on its count), without reading the file again.

use rand_distr::{Distribution, Poisson};

use super::conventions::{mig_fit, purpose, stream_rng};
use super::error::TraceError;
use super::reader::{BadRows, CsvFile, shown};
use super::{Pass1, Plan, ProfileWaste, StreamStats, TraceFormat, TraceOptions, TraceScan, build_scan, finish};

const NAME: usize = 0;
const CPU_MILLI: usize = 1;
const MEMORY_MIB: usize = 2;
const NUM_GPU: usize = 3;
const GPU_MILLI: usize = 4;
const QOS: usize = 6;
const CREATION: usize = 8;
const DELETION: usize = 9;
const SCHEDULED: usize = 10;

/// The most GPUs one pod may hold. A pod runs on one node, and no node has more (the coordinator accepts at most 64
/// GPUs per node); the public trace's pods hold up to 8. A larger count is a corrupt row, and would make the pod's
/// request rate, and the run, as large.
pub(crate) const MAX_POD_GPUS: u64 = 64;

struct Pod {
    name: String,
    num_gpu: u32,
    gpu_milli: u32,
    qos: String,
    start: f64,
    end: Option<f64>,
}

/// Pass 1: reads the pods, draws each one's request count in the window, samples.
pub(crate) fn scan(mut csv: CsvFile, opts: &TraceOptions) -> Result<TraceScan, TraceError> {
    let mut bad = BadRows::new(opts.skip_bad_rows);
    let mut pods = Vec::new();
    let (mut rows, mut skipped) = (0u64, 0u64);
    let mut last_time = 0.0f64;
    while csv.next()? {
        rows += 1;
        match parse(&csv, opts) {
            Ok((Some(pod), latest)) => {
                last_time = last_time.max(latest);
                pods.push(pod);
            }
            Ok((None, latest)) => {
                last_time = last_time.max(latest);
                skipped += 1;
            }
            Err(e) => bad.handle(e)?,
        }
    }
    let ws = opts.window_start_s;
    let we = if opts.window_duration_s.is_some() { opts.window_end_s() } else { last_time.max(ws) };
    let mut streams = Vec::new();
    for pod in pods {
        let (a, b) = (pod.start.max(ws), pod.end.unwrap_or(last_time).min(we));
        if b <= a {
            continue;
        }
        let rate = opts.pod_rps_per_gpu * f64::from(pod.num_gpu) * f64::from(pod.gpu_milli) / 1000.0;
        let mean = rate * (b - a);
        let mut rng = stream_rng(opts.seed, &pod.name, purpose::POISSON);
        let n = Poisson::new(mean).map(|p| p.sample(&mut rng) as u64).unwrap_or(0);
        if n == 0 {
            continue;
        }
        let fit = mig_fit(pod.gpu_milli, None).expect("gpu_milli checked to be in 1..=1000");
        let mut s = StreamStats::new(pod.name, n);
        s.gpu_milli = Some(pod.gpu_milli);
        s.num_gpu = Some(pod.num_gpu);
        s.mig_profile = Some(fit.profile);
        s.profile_waste_milli = Some(fit.waste_milli * pod.num_gpu);
        s.label = Some(pod.qos);
        s.active_s = Some((a, b));
        streams.push(s);
    }
    let mut p = Pass1 { rows, bad, skipped_rows: skipped, window_start_s: ws, window_end_s: we, streams };
    let (picked, total_requests, total_streams) = finish(&mut p, opts);
    let mut waste = ProfileWaste {
        pods: 0,
        requested_milli: 0,
        allocated_milli: 0,
        waste_fraction: 0.0,
        by_profile: Default::default(),
    };
    for s in &picked {
        let (milli, gpus, profile) = (s.gpu_milli.unwrap_or(0), s.num_gpu.unwrap_or(0), s.mig_profile);
        waste.pods += 1;
        waste.requested_milli += u64::from(milli) * u64::from(gpus);
        waste.allocated_milli += u64::from(milli + s.profile_waste_milli.unwrap_or(0) / gpus.max(1)) * u64::from(gpus);
        if let Some(profile) = profile {
            *waste.by_profile.entry(profile.short_name().to_string()).or_default() += u64::from(gpus);
        }
    }
    if waste.allocated_milli > 0 {
        waste.waste_fraction = 1.0 - waste.requested_milli as f64 / waste.allocated_milli as f64;
    }
    let spans = picked.iter().map(|s| {
        let (a, b) = s.active_s.unwrap_or((ws, ws));
        (a, b, s.requests)
    });
    let plan = Plan::Intervals { spans: spans.collect() };
    let path = csv.path.clone();
    let mut scan = build_scan(path, TraceFormat::Alibaba2023, p, picked, total_requests, total_streams, opts, plan);
    scan.profile_waste = Some(waste);
    Ok(scan)
}

/// One pod: `Some` for a GPU pod that counts, `None` for a well-formed row that carries no GPU demand; with the
/// latest time the row mentions.
fn parse(csv: &CsvFile, opts: &TraceOptions) -> Result<(Option<Pod>, f64), super::RowError> {
    csv.check_len(csv.header.len())?;
    let name = csv.key(NAME)?;
    csv.u64(CPU_MILLI)?;
    csv.u64(MEMORY_MIB)?;
    let num_gpu = csv.u64(NUM_GPU)?;
    let gpu_milli = csv.u64(GPU_MILLI)?;
    let creation = csv.time_s(CREATION)?;
    let deletion = csv.opt_time_s(DELETION)?;
    let scheduled = csv.opt_time_s(SCHEDULED)?;
    if let Some(d) = deletion
        && d < creation
    {
        return Err(csv.err(
            DELETION,
            format!("deletion_time {} is before creation_time {creation}", shown(csv.field(DELETION))),
        ));
    }
    let latest = creation.max(deletion.unwrap_or(creation)).max(scheduled.unwrap_or(creation));
    if num_gpu == 0 {
        return Ok((None, latest));
    }
    if num_gpu > MAX_POD_GPUS {
        return Err(
            csv.err(NUM_GPU, format!("expected at most {MAX_POD_GPUS} GPUs (a pod runs on one node), found {num_gpu}"))
        );
    }
    if !(1..=1000).contains(&gpu_milli) {
        return Err(csv.err(GPU_MILLI, format!("expected 1..=1000 for a GPU pod, found {gpu_milli}")));
    }
    let start = if opts.scheduled_pods_only {
        match scheduled {
            Some(s) => s,
            None => return Ok((None, latest)),
        }
    } else {
        creation
    };
    let pod = Pod {
        name: String::from_utf8_lossy(name).into_owned(),
        num_gpu: num_gpu as u32,
        gpu_milli: gpu_milli as u32,
        qos: String::from_utf8_lossy(csv.field(QOS).trim_ascii()).into_owned(),
        start,
        end: deletion,
    };
    Ok((Some(pod), latest))
}
