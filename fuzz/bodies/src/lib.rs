//! The bodies of the fuzz targets: one function per parser of outside input, called by `fuzz_targets/NAME.rs` under
//! libFuzzer and by `tests/corpora.rs` over every committed corpus file (`fuzz/corpus/NAME/`). Each goes in through the public entry
//! point the program itself uses (the path a file is read from, the text of a configuration, the bytes of a gRPC
//! request) and must not panic, whatever the input: an error is a fine answer. Where a result must satisfy an
//! invariant (a layout prints and parses back to itself), it is checked.
//!
//! | target | input | parser |
//! |---|---|---|
//! | `trace_*` | option byte, then the trace file (Azure 2019: then `\x1e` durations file `\x1e` memory file) | `trace::scan`, then pass 2 |
//! | `tenant_toml`, `model_toml`, `fleet_toml` | TOML | `config::parse_tenants`, `parse_model_profile`, `parse_fleet` |
//! | `study_toml` | TOML | `study::check` (`replay study`) |
//! | `agent_config`, `coordinator_config` | TOML | `parse_agent_config`, `CoordinatorConfig::parse` |
//! | `migparted_yaml` | YAML | `migparted::parse`, then `import` of every configuration for every GPU model |
//! | `layout_str` | text | `Layout::parse_for` (short names and every model's names) |
//! | `load_exposition` | text | the agent's load scraper: `load::parse_sample` on each line, `load::counter_value` |
//! | `proto_*_requests` | request kind byte, then the protobuf message | `prost::Message::decode`, then what the server converts it into |
//! | `proto_coordinator_answers` | answer kind byte, then a register or heartbeat answer | what an agent learns from it: `Authority::learn`, `learn_revocations`, then a push checked |
//! | `raft_log` | mode byte, then bytes for a log segment | `wal::Wal::open` (the coordinator's Raft log), then an append and a reopen |

use std::path::{Path, PathBuf};
use std::str::FromStr;

use prost::Message;
use tessera_core::GpuModel;
use tessera_core::ids::{GpuId, NodeId, TenantId};
use tessera_core::layout::{Layout, Placement};
use tessera_proto::v1;
use tessera_replay::trace::{self, CountsToArrivals, GroupBy, Sample, SyntheticArrivals, TraceFormat, TraceOptions};

// ---------------------------------------------------------------------------------------------------------------
// Traces.

/// Pass 2 runs only when the scan found at most this many requests to emit (the formats whose request count is not
/// bounded by the file's size, Azure 2019 counts and Alibaba pods, would otherwise measure the memory of the
/// machine, not the parser).
const MAX_PASS2_REQUESTS: u64 = 100_000;

/// Separates the Azure 2019 invocations file from its durations and memory files in one input.
const PART_SEPARATOR: u8 = 0x1e;

/// Where this thread writes the files it scans: one directory per process and thread (the corpus test runs targets
/// on several threads), reused by every input.
fn scratch_dir() -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    thread_local! {
        static DIR: PathBuf = {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("tessera-fuzz-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create the scratch directory");
            dir
        };
    }
    DIR.with(PathBuf::clone)
}

fn write(name: &str, data: &[u8]) -> PathBuf {
    let path = scratch_dir().join(name);
    std::fs::write(&path, data).expect("write a scratch file");
    path
}

/// The options the first byte selects: bit 0 skips bad rows, bits 1-2 the grouping, bits 3-4 the counts-to-arrivals
/// convention, bit 5 the random shift, bit 6 forces the format (else it is detected from the header), bit 7 samples
/// the top 2 streams and a window (else every stream, the whole trace). With bits 3-4 = 3 on a per-row format,
/// synthetic Gamma arrivals replace the recorded times.
fn options(format: TraceFormat, flags: u8) -> TraceOptions {
    let mut o = TraceOptions {
        skip_bad_rows: flags & 1 != 0,
        group_by: [GroupBy::Function, GroupBy::App, GroupBy::Owner, GroupBy::Function][usize::from(flags >> 1 & 3)],
        counts_to_arrivals: [
            CountsToArrivals::Uniform,
            CountsToArrivals::Equidistant,
            CountsToArrivals::ExpNormalised,
            CountsToArrivals::PoissonFit,
        ][usize::from(flags >> 3 & 3)],
        random_shift: flags & 32 != 0,
        format: (flags & 64 != 0).then_some(format),
        ..TraceOptions::default()
    };
    if flags & 128 != 0 {
        o.sample = Sample::TopK(2);
        o.window_start_s = 30.0;
        o.window_duration_s = Some(600.0);
        o.time_scale = 0.5;
        o.max_reorder_s = 60.0;
        o.scheduled_pods_only = true;
    }
    if flags >> 3 & 3 == 3 && format != TraceFormat::AzureFunctions2019 && format != TraceFormat::Alibaba2023 {
        o.synthetic_arrivals = Some(SyntheticArrivals { rate_rps: 5.0, cv: 2.0 });
    }
    o
}

/// Scans `path` with `opts` and, when the scan succeeds, reads the arrivals (pass 2); checks that they come in time
/// order, at finite non-negative times, from sampled streams.
fn scan_and_read(path: &Path, opts: &TraceOptions) {
    let Ok(scan) = trace::scan(path, opts) else { return };
    if scan.sampled_requests() > MAX_PASS2_REQUESTS {
        return;
    }
    let Ok(arrivals) = scan.arrivals(1.0).and_then(|a| a.collect_all()) else { return };
    let mut last = 0.0;
    for a in &arrivals {
        assert!(a.time_s.is_finite() && a.time_s >= last, "arrival at {} after {last}", a.time_s);
        assert!((a.stream as usize) < scan.streams.len(), "arrival of stream {}", a.stream);
        assert!(a.work.is_finite() && a.work >= 0.0, "arrival with work {}", a.work);
        last = a.time_s;
    }
}

/// A per-row or Alibaba trace: the option byte, then the file.
fn trace_file(format: TraceFormat, data: &[u8]) {
    let Some((&flags, file)) = data.split_first() else { return };
    let path = write("trace.csv", file);
    scan_and_read(&path, &options(format, flags));
}

/// Azure Functions 2019: the option byte, the invocations file, then optionally `\x1e` and the durations file, then
/// `\x1e` and the memory file (read as `--durations` and `--memory` give them).
pub fn trace_azure2019(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else { return };
    let mut parts = rest.splitn(3, |&b| b == PART_SEPARATOR);
    let invocations = write("trace.csv", parts.next().unwrap_or_default());
    let mut opts = options(TraceFormat::AzureFunctions2019, flags);
    opts.durations_path = parts.next().map(|d| write("durations.csv", d));
    opts.memory_path = parts.next().map(|m| write("memory.csv", m));
    scan_and_read(&invocations, &opts);
}

/// Azure Functions 2021 (`app,func,end_timestamp,duration`).
pub fn trace_azure2021(data: &[u8]) {
    trace_file(TraceFormat::AzureFunctions2021, data);
}

/// Azure LLM 2023/2024 (`TIMESTAMP,ContextTokens,GeneratedTokens`).
pub fn trace_azure_llm(data: &[u8]) {
    trace_file(TraceFormat::AzureLlm, data);
}

/// Alibaba GPU-sharing 2023 pod list.
pub fn trace_alibaba(data: &[u8]) {
    trace_file(TraceFormat::Alibaba2023, data);
}

/// The generic CSV (`timestamp_s,tenant[,tokens...]`).
pub fn trace_generic(data: &[u8]) {
    trace_file(TraceFormat::Generic, data);
}

// ---------------------------------------------------------------------------------------------------------------
// Configuration files. Every loader reads the file as UTF-8 (`read_to_string`), so other bytes never reach them.

/// A tenants file (`configs/tenants/*.toml`).
pub fn tenant_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = tessera_core::config::parse_tenants(text, Path::new("tenants.toml"));
}

/// A model profile (`configs/models/*.toml`).
pub fn model_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = tessera_core::config::parse_model_profile(text, Path::new("model.toml"));
}

/// A fleet file (`configs/fleets/*.toml`).
pub fn fleet_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = tessera_core::config::parse_fleet(text, Path::new("fleet.toml"));
}

/// A study file (`replay study`, `configs/studies/*.toml`).
pub fn study_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = tessera_replay::study::check(text, Path::new("study.toml"));
}

/// The agent's configuration (`configs/agent.toml`).
pub fn agent_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = tessera_agent::config::parse_agent_config(text, Path::new("conf/agent.toml"));
}

/// The coordinator's configuration (`configs/coordinator.toml`), without command-line overrides.
pub fn coordinator_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let over = tessera_coordinator::config::Overrides::default();
    let _ = tessera_coordinator::config::CoordinatorConfig::parse(text, Path::new("conf/coordinator.toml"), &over);
}

/// A mig-parted file: parsed, then every configuration imported for every GPU model. An imported layout must be
/// valid on its model, and exporting it and importing the export must give it back.
pub fn migparted_yaml(data: &[u8]) {
    use tessera_core::migparted;
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(file) = migparted::parse(text) else { return };
    for name in file.mig_configs.keys() {
        for model in GpuModel::ALL {
            let Ok(groups) = migparted::import(&file, name, model) else { continue };
            for g in groups {
                if let Err(e) = g.layout.validate(model) {
                    panic!("imported layout {} is invalid on {model}: {e}", g.layout);
                }
                let exported = migparted::export(name, model, &g.layout);
                let back = migparted::parse(&exported)
                    .and_then(|f| migparted::import(&f, name, model))
                    .unwrap_or_else(|e| panic!("export of {} does not import: {e}\n{exported}", g.layout));
                assert_eq!(back.len(), 1, "{exported}");
                // The placements travel in a comment line, left out where the name cannot be written on one.
                if exported.contains("# tessera.placements:") || g.layout.is_empty() {
                    assert_eq!(back[0].layout, g.layout, "{exported}");
                } else {
                    assert_eq!(back[0].layout.profile_counts(), g.layout.profile_counts(), "{exported}");
                }
            }
        }
    }
}

/// A layout string (`3g@0 2g@4 1g@6`), with short names and with each GPU model's nvidia-smi names. A parsed layout
/// prints and parses back to itself, in both spellings.
pub fn layout_str(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = Placement::from_str(text);
    if let Ok(layout) = Layout::from_str(text) {
        let shown = layout.to_string();
        assert_eq!(Layout::from_str(&shown).as_ref(), Ok(&layout), "{shown}");
        let _ = (layout.slice_map(), layout.stranded_compute_slices(), layout.first_overlap());
    }
    for model in GpuModel::ALL {
        let Ok(layout) = Layout::parse_for(text, Some(model)) else { continue };
        let _ = layout.validate(model);
        let shown = layout.display_for(model);
        assert_eq!(Layout::parse_for(&shown, Some(model)).as_ref(), Ok(&layout), "{shown} on {model}");
    }
}

/// A serving stack's `/metrics` text as the agent's load scraper reads it (`load.rs`): every line parsed, and the
/// counter summed for a name and a label filter taken from the input's first line (`NAME LABEL=VALUE`). A parsed
/// sample has a name and its labels; a sum is never NaN unless a sample is.
pub fn load_exposition(data: &[u8]) {
    use tessera_agent::load::{counter_value, parse_sample};
    let Ok(text) = std::str::from_utf8(data) else { return };
    for line in text.lines() {
        if let Some(s) = parse_sample(line) {
            assert!(!s.name.is_empty() && !s.name.starts_with(|c: char| c.is_ascii_digit()), "{line:?}");
        }
    }
    let first = text.lines().next().unwrap_or_default();
    let mut words = first.split_whitespace();
    let metric = words.next().unwrap_or("x");
    let labels = words.filter_map(|w| w.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    if let Ok(v) = counter_value(text, metric, &labels) {
        assert!(v.is_finite() && v >= 0.0, "{metric}: {v}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// gRPC requests: the first byte picks the request, the rest is its protobuf encoding. Each is decoded as tonic
// decodes it and converted as the server's handler does before it acts.

/// `tessera.v1.Agent`: `ApplyLayout`, `GetState`, `AdvanceClock`, `Arrive`.
pub fn proto_agent_requests(data: &[u8]) {
    let Some((&kind, bytes)) = data.split_first() else { return };
    // Kinds 0xF0 and up: ReportLoad (added after the corpus, whose kinds keep their meaning below 0xF0).
    if kind >= 0xF0 {
        if let Ok(r) = v1::ReportLoadRequest::decode(bytes) {
            let _ = r.source.len() <= tessera_agent::service::MAX_LOAD_SOURCE_BYTES;
            for t in r.tenants.into_iter().take(tessera_agent::service::MAX_LOAD_TENANTS) {
                let _ = TenantId::new(t.tenant);
            }
        }
        return;
    }
    match kind % 4 {
        0 => {
            if let Ok(r) = v1::ApplyLayoutRequest::decode(bytes) {
                let _ = tessera_agent::service::targets_from_wire(r.targets);
            }
        }
        1 => {
            let _ = v1::GetStateRequest::decode(bytes);
        }
        2 => {
            let _ = v1::AdvanceClockRequest::decode(bytes);
        }
        _ => {
            if let Ok(r) = v1::ArriveRequest::decode(bytes) {
                for a in r.arrivals {
                    let _ = TenantId::new(a.tenant);
                }
            }
        }
    }
}

/// The coordinator's `HOST:PORT` check of `Register` and `AddMember` (as `coordinator::service` makes it).
fn address_ok(address: &str) -> bool {
    !address.is_empty()
        && address.len() <= tessera_coordinator::service::MAX_ADDRESS_BYTES
        && address.contains(':')
        && !address.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// `tessera.v1.Coordinator` (what agents call): `Register`, `Heartbeat`, and `GetLeadership` (kind byte 255).
pub fn proto_coordinator_requests(data: &[u8]) {
    let Some((&kind, bytes)) = data.split_first() else { return };
    if kind == u8::MAX {
        // GetLeadership: the asking node's id, checked against its certificate.
        let Ok(r) = v1::LeadershipRequest::decode(bytes) else { return };
        let _ = NodeId::new(r.node_id);
        return;
    }
    if kind % 2 == 0 {
        let Ok(r) = v1::RegisterRequest::decode(bytes) else { return };
        if NodeId::new(r.node_id).is_err()
            || !address_ok(&r.address)
            || r.gpus.len() > tessera_coordinator::service::MAX_GPUS_PER_NODE
        {
            return;
        }
        for g in r.gpus {
            let _ = tessera_core::fleet::GpuDescriptor::try_from(g);
        }
    } else {
        let Ok(r) = v1::HeartbeatRequest::decode(bytes) else { return };
        let Some(state) = r.state else { return };
        let Ok(node) = NodeId::new(state.node_id.clone()) else { return };
        // What the leader makes of the reported GPUs (`reports`): placements, tenants and roles of each instance.
        for g in &state.gpus {
            let _ = GpuId::new(node.clone(), g.index);
            let mut placements = Vec::new();
            for inst in &g.instances {
                let Some(p) = inst.placement.clone().and_then(|p| Placement::try_from(p).ok()) else { break };
                placements.push(p);
                for w in &inst.work {
                    let _ = TenantId::new(w.tenant.clone());
                    let _ = tessera_proto::convert::plan::role_from_wire("role", w.role);
                }
            }
            let _ = Layout::new(placements);
        }
        if let Some(m) = &state.metrics {
            for t in &m.tenants {
                let _ = TenantId::new(t.tenant.clone());
            }
        }
    }
}

/// What an agent takes from the coordinators' answers to its register and heartbeat calls: who leads and the
/// revocation list (a lying or broken member answers too). A list the agent takes holds only well-formed serials.
pub fn proto_coordinator_answers(data: &[u8]) {
    use tessera_agent::authority::{Authority, MAX_REVOKED, MAX_SERIAL_HEX};
    let Some((&kind, bytes)) = data.split_first() else { return };
    let leadership = if kind % 2 == 0 {
        v1::RegisterResponse::decode(bytes).ok().and_then(|r| r.leadership)
    } else {
        v1::HeartbeatResponse::decode(bytes).ok().and_then(|r| r.leadership)
    };
    let Some(l) = leadership else { return };
    let authority = Authority::standalone();
    authority.learn((&l).into());
    if let Some(list) = &l.revocations
        && authority.learn_revocations(list).is_ok()
    {
        assert!(list.serials.len() <= MAX_REVOKED);
        assert!(
            list.serials.iter().all(|s| s.len() <= MAX_SERIAL_HEX && authority.is_revoked(&s.to_ascii_lowercase()))
        );
        assert_eq!(authority.revocations_index(), list.index);
    }
    let _ = authority.check_known(Some(l.leader_id), l.term, l.plan_epoch);
}

/// `tessera.v1.CoordinatorApi` (what operators call): every request type.
pub fn proto_coordinator_api_requests(data: &[u8]) {
    let Some((&kind, bytes)) = data.split_first() else { return };
    match kind % 11 {
        // CreateTenant, UpdateTenant.
        0 => {
            let Ok(r) = v1::TenantRequest::decode(bytes) else { return };
            let Some(spec) = r.spec else { return };
            if let Ok(spec) = tessera_core::tenant::TenantSpec::try_from(spec) {
                let _ = tessera_core::config::validate_tenant(&spec);
            }
        }
        // DeleteTenant, GetTenant.
        1 => {
            if let Ok(r) = v1::TenantIdRequest::decode(bytes) {
                let _ = TenantId::new(r.id);
            }
        }
        // ListTenants, ListNodes, GetPlan, DumpPlannerInput, ListAudit.
        2 => {
            let _ = v1::ListRequest::decode(bytes);
        }
        3 => {
            if let Ok(r) = v1::DrainGpuRequest::decode(bytes) {
                let _ = GpuId::from_str(&r.gpu);
            }
        }
        // PlanHistory, Explain.
        4 => {
            if let Ok(r) = v1::GpuRequest::decode(bytes) {
                let _ = GpuId::from_str(&r.gpu);
            }
        }
        5 => {
            let _ = v1::TriggerPlanRequest::decode(bytes);
        }
        6 => {
            let _ = v1::ClusterStatusRequest::decode(bytes);
        }
        7 => {
            if let Ok(r) = v1::AddMemberRequest::decode(bytes) {
                let _ = address_ok(&r.address);
            }
        }
        8 => {
            let _ = v1::RemoveMemberRequest::decode(bytes);
        }
        // RevokeCertificate: the serial as the service normalises it.
        9 => {
            if let Ok(r) = v1::RevokeCertificateRequest::decode(bytes)
                && let Some(serial) = tessera_auth::normalize_serial(&r.serial)
            {
                assert!(
                    serial.len() <= 40 && tessera_auth::normalize_serial(&serial).as_deref() == Some(serial.as_str())
                );
            }
        }
        _ => {
            let _ = v1::AdvanceClockRequest::decode(bytes);
        }
    }
}

/// `tessera.v1.Raft` (what coordinator members call): `Step` (a batch of raft messages, each decoded, late
/// proposals dropped) and `Isolate`.
pub fn proto_raft_requests(data: &[u8]) {
    use tessera_coordinator::transport::Transport;
    let Some((&kind, bytes)) = data.split_first() else { return };
    if kind % 2 == 0 {
        let Ok(batch) = v1::RaftBatch::decode(bytes) else { return };
        let Ok(mut messages) = Transport::decode(&batch) else { return };
        let _ = Transport::drop_expired_proposals(&mut messages, 1_000_000);
    } else {
        let _ = v1::IsolateRequest::decode(bytes);
    }
}

/// The coordinator's Raft log read back from a segment a crash or a disk may have left (`wal::Wal::open`): bit 0 of
/// the mode byte chooses whether the bytes follow a valid header and three entries (a damaged or torn tail) or are
/// the whole segment. Whatever it returns, the log is consecutive; an open that succeeds cuts only once (a second
/// open finds the same log), and an append after it reads back.
pub fn raft_log(data: &[u8]) {
    use raft::prelude::Entry;
    use tessera_coordinator::wal::{SEGMENT_BYTES, Wal};
    let Some((&mode, bytes)) = data.split_first() else { return };
    let dir = scratch_dir().join("wal");
    let _ = std::fs::remove_dir_all(&dir);
    let entry = |index: u64, term: u64| Entry { index, term, data: vec![7; 20].into(), ..Default::default() };
    Wal::create(&dir, &[entry(1, 1), entry(2, 1), entry(3, 1)], SEGMENT_BYTES).expect("create a log");
    let segment = std::fs::read_dir(&dir).expect("list the log").next().expect("a segment").expect("entry").path();
    if mode & 1 == 0 {
        let mut f = std::fs::OpenOptions::new().append(true).open(&segment).expect("open the segment");
        std::io::Write::write_all(&mut f, bytes).expect("append to the segment");
    } else {
        std::fs::write(&segment, bytes).expect("write the segment");
    }
    let indexes = |log: &std::collections::VecDeque<Entry>| log.iter().map(|e| (e.index, e.term)).collect::<Vec<_>>();
    let Ok((mut wal, log)) = Wal::open(&dir, SEGMENT_BYTES) else { return };
    let first = indexes(&log);
    assert!(first.windows(2).all(|p| p[1].0 == p[0].0 + 1), "the log is not consecutive: {first:?}");
    drop(wal);
    let (again, log) = Wal::open(&dir, SEGMENT_BYTES).expect("a log that opened opens again");
    assert_eq!(indexes(&log), first, "a second open found another log");
    wal = again;
    let next = first.last().map_or(1, |(i, _)| i + 1);
    wal.append(&[entry(next, 9)]).expect("append after the open");
    drop(wal);
    let (_, log) = Wal::open(&dir, SEGMENT_BYTES).expect("the log opens after an append");
    assert_eq!(log.back().map(|e| (e.index, e.term)), Some((next, 9)), "the append did not read back");
}

/// A target's body: one input, which must not make it panic.
pub type Body = fn(&[u8]);

/// Every target by name, for the corpus test.
pub const TARGETS: [(&str, Body); 20] = [
    ("trace_azure2019", trace_azure2019),
    ("trace_azure2021", trace_azure2021),
    ("trace_azure_llm", trace_azure_llm),
    ("trace_alibaba", trace_alibaba),
    ("trace_generic", trace_generic),
    ("tenant_toml", tenant_toml),
    ("model_toml", model_toml),
    ("fleet_toml", fleet_toml),
    ("study_toml", study_toml),
    ("agent_config", agent_config),
    ("coordinator_config", coordinator_config),
    ("migparted_yaml", migparted_yaml),
    ("layout_str", layout_str),
    ("load_exposition", load_exposition),
    ("proto_agent_requests", proto_agent_requests),
    ("proto_coordinator_requests", proto_coordinator_requests),
    ("proto_coordinator_answers", proto_coordinator_answers),
    ("proto_coordinator_api_requests", proto_coordinator_api_requests),
    ("proto_raft_requests", proto_raft_requests),
    ("raft_log", raft_log),
];
