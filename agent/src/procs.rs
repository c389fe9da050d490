//! Which host processes run on a MIG device, read from `/proc` (Linux).
//!
//! A process runs on a MIG instance when its environment names the instance's MIG UUID in `CUDA_VISIBLE_DEVICES`
//! (or a container runtime's `NVIDIA_VISIBLE_DEVICES`): that is how the agent's supervisor starts jobs, and how CUDA
//! picks the device. On a real GPU the driver's own list (`nvmlDeviceGetComputeRunningProcesses`) is the authority;
//! the simulated node uses this one, so that the rule "never destroy an instance with processes attached" holds
//! against real processes in tests. A process whose environment cannot be read (another user's, or one that has
//! exited) is not counted.

use std::path::Path;

use tessera_core::ids::MigUuid;

/// The variables a process names its devices in.
const DEVICE_VARIABLES: [&str; 2] = ["CUDA_VISIBLE_DEVICES=", "NVIDIA_VISIBLE_DEVICES="];

/// Whether an environment block (`/proc/PID/environ`: `NAME=value` entries separated by NUL bytes) names `uuid`
/// among its visible devices.
pub fn environ_names(environ: &[u8], uuid: &str) -> bool {
    environ.split(|b| *b == 0).any(|entry| {
        let Ok(entry) = std::str::from_utf8(entry) else { return false };
        DEVICE_VARIABLES
            .iter()
            .filter_map(|var| entry.strip_prefix(var))
            .any(|list| list.split(',').any(|d| d.trim() == uuid))
    })
}

/// The PIDs of the live processes whose environment has `name=value`, ascending.
pub fn processes_with_env(name: &str, value: &str) -> Vec<u32> {
    let entry = format!("{name}={value}");
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == entry.as_bytes()))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The PIDs of the live processes whose environment names `uuid`, ascending.
pub fn processes_using(uuid: &MigUuid) -> Vec<u32> {
    processes_using_in(Path::new("/proc"), &uuid.to_string())
}

fn processes_using_in(proc_root: &Path, uuid: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(proc_root) else { return Vec::new() };
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read(proc_root.join(pid.to_string()).join("environ")).is_ok_and(|env| environ_names(&env, uuid))
        })
        .collect();
    pids.sort_unstable();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_environment_names_a_device_in_either_variable_and_in_a_list() {
        let u = "MIG-00000000-0000-4000-8000-000000000001";
        assert!(environ_names(format!("A=1\0CUDA_VISIBLE_DEVICES={u}\0").as_bytes(), u));
        assert!(environ_names(format!("NVIDIA_VISIBLE_DEVICES=MIG-x, {u}").as_bytes(), u));
        assert!(!environ_names(format!("OTHER={u}\0CUDA_VISIBLE_DEVICES=0").as_bytes(), u));
        assert!(!environ_names(b"", u));
    }

    #[test]
    fn a_child_process_started_on_a_device_is_found_until_it_exits() {
        let uuid = MigUuid(0x1234_5678_9abc_4def_8000_0000_0000_0042);
        assert!(processes_using(&uuid).is_empty());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("CUDA_VISIBLE_DEVICES", uuid.to_string())
            .spawn()
            .expect("sleep runs");
        // Until the child has exec'd, /proc shows the parent's environment: wait for it (a loaded machine takes a
        // while), then it must be the only one found.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while processes_using(&uuid).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(processes_using(&uuid), vec![child.id()]);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(processes_using(&uuid).is_empty());
    }
}
