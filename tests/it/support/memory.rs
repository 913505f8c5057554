//! The service's memory as the kernel counts it (`/proc/<pid>/status`).

use super::server::Server;

pub const MIB: u64 = 1 << 20;

/// The service's peak resident set (`VmHWM`) and current one (`VmRSS`), in bytes.
pub fn memory(server: &Server) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let kib = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        let n: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        n * 1024
    };
    (kib("VmHWM:"), kib("VmRSS:"))
}

/// Reset the service's `VmHWM` to its current RSS; returns that RSS.
pub fn reset_peak(server: &Server) -> u64 {
    std::fs::write(format!("/proc/{}/clear_refs", server.pid()), "5").unwrap();
    let (peak, rss) = memory(server);
    assert!(
        peak <= rss + 4 * MIB,
        "VmHWM was not reset: {peak} vs {rss}"
    );
    rss
}
