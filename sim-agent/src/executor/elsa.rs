//! ELSA, PARIS's dispatcher (Kim et al., "PARIS and ELSA: an elastic scheduling algorithm for reconfigurable
//! multi-GPU inference servers", DAC 2022): each request goes to the smallest partition that still meets its
//! deadline, else to the one that finishes first. The executor uses it under [`Dispatch::Elsa`](super::Dispatch).

/// One partition as ELSA sees it when a request arrives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ElsaPartition {
    /// Compute slices (its size: smaller is preferred).
    pub compute_slices: u8,
    /// When the work already queued on it finishes, ms of workload time.
    pub free_at_ms: f64,
    /// Latency of the request's batch on it, ms.
    pub latency_ms: f64,
}

/// ELSA's dispatch of one request (or batch) at `now_ms` that must finish by `deadline_ms`: the smallest
/// partition whose estimated finish (`max(now, free_at) + latency`) meets the deadline; if none does, the one that
/// finishes first. Ties go to the earlier finish, then the lower index. `None` only when there is no partition.
pub fn elsa_dispatch(now_ms: f64, deadline_ms: f64, partitions: &[ElsaPartition]) -> Option<usize> {
    let finish = |p: &ElsaPartition| p.free_at_ms.max(now_ms) + p.latency_ms;
    let meeting = partitions
        .iter()
        .enumerate()
        .filter(|(_, p)| finish(p) <= deadline_ms)
        .min_by(|(a, pa), (b, pb)| {
            pa.compute_slices.cmp(&pb.compute_slices).then(finish(pa).total_cmp(&finish(pb))).then(a.cmp(b))
        })
        .map(|(k, _)| k);
    meeting.or_else(|| {
        partitions
            .iter()
            .enumerate()
            .min_by(|(a, pa), (b, pb)| {
                finish(pa).total_cmp(&finish(pb)).then(pa.compute_slices.cmp(&pb.compute_slices)).then(a.cmp(b))
            })
            .map(|(k, _)| k)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elsa_sends_a_request_to_the_smallest_partition_that_meets_the_slo() {
        let parts = [
            ElsaPartition { compute_slices: 3, free_at_ms: 0.0, latency_ms: 4.0 },
            ElsaPartition { compute_slices: 1, free_at_ms: 0.0, latency_ms: 10.0 },
            ElsaPartition { compute_slices: 2, free_at_ms: 0.0, latency_ms: 6.0 },
        ];
        // Every partition meets a 20 ms deadline: the 1g one.
        assert_eq!(elsa_dispatch(0.0, 20.0, &parts), Some(1));
        // 8 ms: only the 2g and 3g finish in time; the smaller wins.
        assert_eq!(elsa_dispatch(0.0, 8.0, &parts), Some(2));
        // Queued work counts: the 2g is busy until 5 ms, so only the 3g meets 8 ms.
        let mut busy = parts;
        busy[2].free_at_ms = 5.0;
        assert_eq!(elsa_dispatch(0.0, 8.0, &busy), Some(0));
        // Nobody meets 3 ms: the earliest finish.
        assert_eq!(elsa_dispatch(0.0, 3.0, &parts), Some(0));
        assert_eq!(elsa_dispatch(0.0, 3.0, &[]), None);
    }
}
