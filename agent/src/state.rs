//! The agent's persisted desired state: the newest plan epoch it accepted and each GPU's target, in
//! `<data_dir>/agent-state.json`.
//!
//! Why persisted: an agent restarted after a crash must still refuse epochs older than one it accepted (an older
//! plan would override a newer one), and it resumes reconciling towards its last target without waiting for the
//! coordinator to push it again. Each save writes a temporary file, syncs it and renames it over the old one, so a
//! crash at any point leaves the previous or the new state, never a torn file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tessera_core::ids::TenantId;
use tessera_core::jobs::TenantJobs;
use tessera_core::plan::GpuPlan;

/// The file name inside the data directory.
pub const STATE_FILE: &str = "agent-state.json";

/// A GPU's target and the epoch of the plan that set it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuTarget {
    /// The plan epoch that set this target.
    pub epoch: u64,
    /// The target.
    pub plan: GpuPlan,
}

/// What the agent has accepted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesiredState {
    /// The newest epoch accepted (0: none).
    pub epoch: u64,
    /// Per GPU index, its current target. GPUs no plan named are absent and left as they are.
    pub gpus: BTreeMap<u32, GpuTarget>,
    /// The jobs of the tenants the targets assign, for those that have jobs (`tessera_core::jobs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub jobs: BTreeMap<TenantId, TenantJobs>,
}

/// The state file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// An I/O error on the file or its directory.
    #[error("{}: {action}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a state file this agent wrote.
    #[error("{}: not a valid agent state file: {message} (move it away to start without a target)", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// The state file of one agent.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// Opens (creating the directory if needed) the state file in `data_dir` and reads what it holds; a missing
    /// file is the empty state.
    pub fn open(data_dir: &Path) -> Result<(StateFile, DesiredState), StateError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StateError::Io {
            path: data_dir.to_path_buf(),
            action: "cannot create the data directory",
            source,
        })?;
        let path = data_dir.join(STATE_FILE);
        let state = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| StateError::Corrupt { path: path.clone(), message: e.to_string() })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => DesiredState::default(),
            Err(source) => return Err(StateError::Io { path, action: "cannot read", source }),
        };
        Ok((StateFile { path }, state))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the file's content with `state`, atomically.
    pub fn save(&self, state: &DesiredState) -> Result<(), StateError> {
        let io = |action, source| StateError::Io { path: self.path.clone(), action, source };
        let tmp = self.path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(state).expect("the desired state always serialises");
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("cannot create the temporary file", e))?;
        f.write_all(text.as_bytes()).map_err(|e| io("cannot write", e))?;
        f.sync_all().map_err(|e| io("cannot sync", e))?;
        drop(f);
        std::fs::rename(&tmp, &self.path).map_err(|e| io("cannot rename the temporary file over", e))?;
        if let Some(dir) = self.path.parent()
            && let Ok(d) = std::fs::File::open(dir)
        {
            // Makes the rename durable; not every platform can sync a directory, and the rename is already atomic.
            let _ = d.sync_all();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_a_torn_file_is_reported_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let (file, empty) = StateFile::open(dir.path()).unwrap();
        assert_eq!(empty, DesiredState::default());
        let plan = GpuPlan {
            layout: "3g@0 3g@4".parse().unwrap(),
            assignments: vec![],
            expected_goodput: 1.5,
            explanation: String::new(),
            upcoming: vec![],
            retraining_epochs: BTreeMap::new(),
            sharing: Default::default(),
        };
        let state =
            DesiredState { epoch: 7, gpus: BTreeMap::from([(2, GpuTarget { epoch: 7, plan })]), jobs: BTreeMap::new() };
        file.save(&state).unwrap();
        assert_eq!(StateFile::open(dir.path()).unwrap().1, state);
        std::fs::write(file.path(), "{\"epoch\": 3,").unwrap();
        let e = StateFile::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains(STATE_FILE) && e.contains("not a valid agent state file"), "{e}");
    }
}
