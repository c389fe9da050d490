//! raft-rs logs through slog; this drain forwards its records to `tracing` (target `raft`), so one filter
//! (`RUST_LOG=raft=debug`) and one exporter see both.

/// A slog drain that re-emits every record as a `tracing` event.
pub struct SlogToTracing;

impl slog::Drain for SlogToTracing {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record<'_>, _values: &slog::OwnedKVList) -> Result<(), slog::Never> {
        let msg = record.msg().to_string();
        match record.level() {
            slog::Level::Critical | slog::Level::Error => tracing::error!(target: "raft", "{msg}"),
            slog::Level::Warning => tracing::warn!(target: "raft", "{msg}"),
            slog::Level::Info => tracing::debug!(target: "raft", "{msg}"),
            slog::Level::Debug | slog::Level::Trace => tracing::trace!(target: "raft", "{msg}"),
        }
        Ok(())
    }
}
