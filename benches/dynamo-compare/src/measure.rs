//! Small measuring helpers: percentiles, and resident memory from `/proc/self/status`.

use std::time::Duration;

/// (p50, p99) of the samples.
pub fn percentiles(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    (at(0.50), at(0.99))
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
