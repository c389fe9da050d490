//! L3 TLB model throughput: TLB accesses simulated per second for a three-tenant mix (streaming, stride, blocked on
//! 3g, 2g, 2g) in baseline and STAR mode. One `simulate` call runs `N` interleaved co-located accesses and then
//! replays each tenant alone (`N` more in total), so it counts as `2 N` elements.
//!
//! Run: `cargo bench -p tessera-sim --bench tlb -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tessera_sim::tlb::{AccessPattern, TenantStreamSpec, TlbMode, TlbParams, simulate};

/// Co-located accesses per simulation.
const ACCESSES: u64 = 1_000_000;

fn three_tenants(c: &mut Criterion) {
    let params = TlbParams::default();
    let tenants: Vec<TenantStreamSpec> =
        [(AccessPattern::Streaming, 3), (AccessPattern::Stride, 2), (AccessPattern::Blocked, 2)]
            .into_iter()
            .map(|(p, g)| TenantStreamSpec::new(p).with_slices(g))
            .collect();
    let mut group = c.benchmark_group("tlb_accesses");
    group.sample_size(10);
    group.throughput(Throughput::Elements(2 * ACCESSES));
    for mode in TlbMode::ALL {
        group.bench_with_input(BenchmarkId::new("streaming_stride_blocked", mode), &mode, |b, &mode| {
            b.iter(|| simulate(&params, black_box(&tenants), mode, black_box(1), ACCESSES).expect("valid mix"))
        });
    }
    group.finish();
}

criterion_group!(benches, three_tenants);
criterion_main!(benches);
