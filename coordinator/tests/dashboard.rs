//! The Grafana dashboard (`deploy/grafana/tessera.json`) queries only metrics the coordinator and the agents export.

use std::collections::BTreeSet;

/// The sample names the families of a Prometheus text exposition define (`# TYPE` lines; a histogram's
/// `_bucket`, `_sum` and `_count`).
fn sample_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
        let Some((name, kind)) = rest.split_once(' ') else { continue };
        out.insert(name.to_string());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                out.insert(format!("{name}{suffix}"));
            }
        }
    }
    out
}

/// Every `tessera_*` identifier in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("tessera_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

#[test]
fn every_dashboard_query_names_an_exported_metric() {
    // Families without a series are not written: give every labelled family one.
    let c = tessera_coordinator::metrics::Metrics::new();
    c.set_gpu_source(|| {
        vec![tessera_coordinator::metrics::GpuGauges {
            gpu: "node-0/0".into(),
            model: "A100-40GB".into(),
            applied_epoch: 1,
            target_epoch: 1,
            instances: [("7g".to_string(), 1)].into(),
            drift_instances: 0,
        }]
    });
    let coordinator = c.encode();
    let dir = tempfile::tempdir().unwrap();
    let node = tessera_sim::node::SimNode::open(
        tessera_core::ids::NodeId::new("node-0").unwrap(),
        1,
        tessera_core::catalog::GpuModel::A100_40GB,
        tessera_sim::node::NodeClock::new(tessera_sim::node::ClockKind::Virtual),
        dir.path(),
    )
    .unwrap();
    let a = tessera_agent::metrics::AgentMetrics::new();
    a.add(node.reconciler.clone(), Some(std::sync::Arc::new(tessera_agent::coordinator::ClientStats::default())));
    a.push("node-0", tessera_agent::metrics::PushOutcome::Refused { rule: "not_leader" });
    node.reconciler.reconcile().unwrap();
    let agent = tessera_metrics::Exposition::openmetrics(&a);
    let known: BTreeSet<String> =
        [coordinator, agent].iter().flat_map(|om| sample_names(&tessera_metrics::to_prometheus_text(om))).collect();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/tessera.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {title} has no query");
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{title}: `{expr}` names no Tessera metric");
            for n in names {
                assert!(known.contains(&n), "{title}: `{expr}` names {n}, which nothing exports");
            }
            queries += 1;
        }
    }
    assert!(queries >= 20, "{queries} queries");
}
