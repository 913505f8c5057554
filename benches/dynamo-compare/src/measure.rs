//! Small measuring helpers: percentiles, resident memory from `/proc/self/status`, and thread
//! CPU time from `/proc/self/task/*/schedstat`.

use std::time::Duration;

/// (p50, p99) of the samples.
pub fn percentiles(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort_unstable();
    (quantile(samples, 0.50), quantile(samples, 0.99))
}

/// A `/proc/self/status` figure in bytes (`VmRSS`: resident now, `VmHWM`: resident peak).
pub fn proc_status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

pub fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The sample at quantile `q` (0..=1) of sorted samples.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// Ids of this process's live threads.
pub fn task_ids() -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| t.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// CPU seconds thread `tid` of this process ran so far, from its `schedstat` (0 once it ended).
pub fn task_cpu_secs(tid: u32) -> f64 {
    schedstat_secs(&format!("/proc/self/task/{tid}/schedstat"))
}

/// CPU seconds the calling thread ran so far.
pub fn thread_cpu_secs() -> f64 {
    schedstat_secs("/proc/thread-self/schedstat")
}

/// CPU seconds every live thread of this process ran so far.
pub fn process_cpu_secs() -> f64 {
    task_ids().into_iter().map(task_cpu_secs).sum()
}

fn schedstat_secs(path: &str) -> f64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 * 1e-9)
}
