//! Probes of processes through `/proc`.

/// The resident set size of process `pid` in KiB (`VmRSS` from `/proc/<pid>/status`).
///
/// Panics if the file cannot be read (the process is gone) or has no `VmRSS` line.
pub fn rss_kib(pid: u32) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/<pid>/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// The soft limit on open files (`RLIMIT_NOFILE`) of this process, from `/proc/self/limits`
/// (`u64::MAX` if unlimited); `None` if it cannot be read. Child processes inherit it.
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line.split_whitespace().nth(3)?;
    if soft == "unlimited" {
        return Some(u64::MAX);
    }
    soft.parse().ok()
}
