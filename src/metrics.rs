//! Prometheus text exposition. Hot-path figures live where they are produced (subscription
//! status cells, index statistics, the query histogram below) and are rendered on scrape, so
//! ingestion never touches a global registry.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::index::IndexStats;
use crate::registry::ServiceInfo;

/// Upper bounds (seconds) of the query latency histogram buckets.
const LATENCY_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// A per-service counter: metric name, help text, and how to read it from a status.
type PerService = (&'static str, &'static str, fn(&ServiceInfo) -> u64);

/// Transports a query can arrive on (a label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Grpc,
    Http,
}

impl Transport {
    const ALL: [Transport; 2] = [Transport::Grpc, Transport::Http];

    const fn as_str(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::Http => "http",
        }
    }
}

#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

/// Query counters and latency, one histogram per transport.
#[derive(Default)]
pub struct QueryMetrics {
    by_transport: [Histogram; 2],
    errors: AtomicU64,
}

impl QueryMetrics {
    pub fn observe(&self, transport: Transport, elapsed: Duration, ok: bool) {
        let h = &self.by_transport[transport as usize];
        let secs = elapsed.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|b| secs <= *b) {
            h.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        h.count.fetch_add(1, Ordering::Relaxed);
        h.sum_nanos.fetch_add(
            elapsed.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Everything one scrape renders.
pub struct Scrape<'a> {
    pub ready: bool,
    pub services: &'a [ServiceInfo],
    pub contexts: &'a [IndexStats],
    pub queries: &'a QueryMetrics,
    /// The latest checkpoint round had a failed write.
    pub storage_degraded: bool,
    pub checkpoint_failures: u64,
    /// Registrations refused by the policy, by label.
    pub registrations_refused: &'a std::collections::BTreeMap<&'static str, u64>,
    /// With registrations shared through etcd.
    pub etcd: Option<EtcdGauges>,
}

/// The gauges of registrations shared through etcd.
#[derive(Debug, Clone, Default)]
pub struct EtcdGauges {
    /// Whether the watch is established.
    pub up: bool,
    /// The revision the registrations are synchronised to.
    pub revision: i64,
    /// Registrations run here that etcd does not hold, since a suspected reset.
    pub held: usize,
    /// Suspected resets so far, by reason label (every reason, 0 included).
    pub resets: Vec<(&'static str, u64)>,
}

/// Gauges a part of the service adds to `/metrics` on its own (the gateway renders them without
/// knowing what they are).
pub trait Section: Send + Sync {
    fn render(&self, w: &mut String);
}

/// Render the Prometheus text format.
pub fn render(s: &Scrape<'_>) -> String {
    let mut out = String::with_capacity(4096);
    let w = &mut out;
    let _ = writeln!(
        w,
        "# HELP conductor_build_info How this binary was built (docs/build.md)\n\
         # TYPE conductor_build_info gauge\n\
         conductor_build_info{{version=\"{}\",debug_assertions=\"{}\",test_hooks=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        cfg!(debug_assertions),
        cfg!(feature = "failpoints"),
    );
    gauge(
        w,
        "conductor_ready",
        "1 once recovery has loaded",
        &[("", s.ready as u64)],
    );
    gauge(
        w,
        "conductor_storage_degraded",
        "1 while checkpoint writes fail (the service serves from memory and retries)",
        &[("", s.storage_degraded as u64)],
    );
    if let Some(etcd) = &s.etcd {
        gauge(
            w,
            "conductor_registry_etcd_up",
            "1 while the etcd watch of the shared registrations is established",
            &[("", etcd.up as u64)],
        );
        gauge(
            w,
            "conductor_registry_etcd_revision",
            "The etcd revision the shared registrations are synchronised to",
            &[("", etcd.revision.max(0) as u64)],
        );
        gauge(
            w,
            "conductor_registry_reset_suspected",
            "1 while registrations are served that etcd lost in a suspected reset (see /health)",
            &[("", (etcd.held > 0) as u64)],
        );
        gauge(
            w,
            "conductor_registry_registrations_held",
            "Registrations served that etcd does not hold, since a suspected reset",
            &[("", etcd.held as u64)],
        );
        header(
            w,
            "conductor_registry_resets_suspected_total",
            "counter",
            "etcd listings that did not continue the history followed (suspected resets), by reason",
        );
        for (reason, n) in &etcd.resets {
            let _ = writeln!(
                w,
                "conductor_registry_resets_suspected_total{{reason=\"{reason}\"}} {n}"
            );
        }
    }
    header(
        w,
        "conductor_checkpoint_failures_total",
        "counter",
        "Checkpoint writes that failed",
    );
    let _ = writeln!(
        w,
        "conductor_checkpoint_failures_total {}",
        s.checkpoint_failures
    );
    header(
        w,
        "conductor_subscription_info",
        "gauge",
        "One per registered subscription, with its state",
    );
    for svc in s.services {
        let c = &svc.config;
        let _ = writeln!(
            w,
            "conductor_subscription_info{{service=\"{}\",type=\"{}\",state=\"{}\",hash_check=\"{}\",connected=\"{}\"}} 1",
            esc(&c.subscription_key().to_string()),
            c.publisher_type,
            svc.status.phase_name(),
            svc.status.hash_check.as_str(),
            svc.status.connected
        );
    }
    let per_service: [PerService; 16] = [
        (
            "conductor_batches_applied_total",
            "Publisher batches applied",
            |i| i.status.seq.applied,
        ),
        (
            "conductor_batches_duplicate_total",
            "Duplicate batches ignored",
            |i| i.status.seq.duplicates,
        ),
        ("conductor_gaps_total", "Sequence gaps detected", |i| {
            i.status.seq.gaps
        }),
        (
            "conductor_publisher_restarts_total",
            "Publisher restarts detected",
            |i| i.status.seq.restarts,
        ),
        (
            "conductor_replays_ok_total",
            "Replays that filled their gap",
            |i| i.status.seq.replays_ok,
        ),
        (
            "conductor_replays_failed_total",
            "Replays that failed or stopped short",
            |i| i.status.seq.replays_failed,
        ),
        (
            "conductor_sources_dropped_total",
            "Times a source's entries were dropped",
            |i| i.status.seq.sources_dropped,
        ),
        (
            "conductor_backpressure_waits_total",
            "Batches that found a context's mailbox full and waited for it",
            |i| i.status.backpressure_waits,
        ),
        (
            "conductor_frame_errors_total",
            "Messages that were not [topic, seq, payload]",
            |i| i.status.frame_errors,
        ),
        (
            "conductor_oversized_messages_total",
            "Messages over max_publisher_message_bytes; each dropped its connection",
            |i| i.status.oversized_messages,
        ),
        (
            "conductor_disconnects_total",
            "Live publisher connections that ended and were reconnected",
            |i| i.status.disconnects,
        ),
        (
            "conductor_publisher_timeouts_total",
            "Live publisher connections given up after publisher_timeout_ms of silence",
            |i| i.status.timeouts,
        ),
        (
            "conductor_publisher_unreachable_drops_total",
            "Sources dropped after publisher_unreachable_grace_ms without a live connection",
            |i| i.status.unreachable_drops,
        ),
        (
            "conductor_decode_errors_total",
            "Payloads whose envelope did not decode",
            |i| i.status.decode_errors,
        ),
        (
            "conductor_invalid_events_total",
            "Single events rejected in good batches",
            |i| i.status.invalid_events,
        ),
        (
            "conductor_blocks_kept_as_published_total",
            "Blocks of events without their extras, not proven plain, kept under published hashes",
            |i| i.status.blocks_kept_as_published,
        ),
    ];
    for (name, help, get) in per_service {
        header(w, name, "counter", help);
        for svc in s.services {
            let _ = writeln!(
                w,
                "{name}{{service=\"{}\"}} {}",
                esc(&svc.config.subscription_key().to_string()),
                get(svc)
            );
        }
    }
    header(
        w,
        "conductor_pending_batches",
        "gauge",
        "Batches handed to contexts and not yet applied (how far behind its source a context is)",
    );
    for svc in s.services {
        let _ = writeln!(
            w,
            "conductor_pending_batches{{service=\"{}\"}} {}",
            esc(&svc.config.subscription_key().to_string()),
            svc.status.pending_batches
        );
    }
    header(
        w,
        "conductor_events_applied_total",
        "counter",
        "Events applied by type and publisher kind",
    );
    for svc in s.services {
        for (kind, n) in &svc.status.events {
            let _ = writeln!(
                w,
                "conductor_events_applied_total{{service=\"{}\",publisher=\"{}\",type=\"{kind}\"}} {n}",
                esc(&svc.config.subscription_key().to_string()),
                svc.config.publisher_type
            );
        }
    }
    header(
        w,
        "conductor_events_ignored_total",
        "counter",
        "Events skipped on purpose, by reason",
    );
    for svc in s.services {
        for (reason, n) in &svc.status.ignored {
            let _ = writeln!(
                w,
                "conductor_events_ignored_total{{service=\"{}\",reason=\"{reason}\"}} {n}",
                esc(&svc.config.subscription_key().to_string())
            );
        }
    }
    header(
        w,
        "conductor_events_refused_total",
        "counter",
        "Events refused by a bound, by the field or limit they broke",
    );
    for svc in s.services {
        for (field, n) in &svc.status.refused {
            let _ = writeln!(
                w,
                "conductor_events_refused_total{{service=\"{}\",field=\"{field}\"}} {n}",
                esc(&svc.config.subscription_key().to_string())
            );
        }
    }
    header(
        w,
        "conductor_registrations_refused_total",
        "counter",
        "Registrations refused by the endpoint policy or a cap, by field or limit",
    );
    for (field, n) in s.registrations_refused {
        let _ = writeln!(
            w,
            "conductor_registrations_refused_total{{field=\"{field}\"}} {n}"
        );
    }
    let sum = |f: fn(&IndexStats) -> u64| s.contexts.iter().map(f).sum::<u64>();
    gauge(
        w,
        "conductor_index_contexts",
        "Live contexts",
        &[("", s.contexts.len() as u64)],
    );
    gauge(
        w,
        "conductor_index_blocks",
        "Distinct blocks indexed",
        &[("", sum(|c| c.blocks))],
    );
    gauge(
        w,
        "conductor_index_holder_blocks",
        "(block, holder) pairs indexed",
        &[("", sum(|c| c.holder_blocks))],
    );
    gauge(
        w,
        "conductor_index_holders",
        "Interned holders",
        &[("", sum(|c| c.holders))],
    );
    gauge(
        w,
        "conductor_index_raw_pairs",
        "(block, holder) pairs keyed by a published hash, not a key derived from tokens",
        &[("", sum(|c| c.raw_pairs))],
    );
    header(
        w,
        "conductor_index_cache_groups",
        "gauge",
        "KV-cache groups of hybrid models' ranks, by kind (docs/engine-events.md, Cache groups)",
    );
    for (i, kind) in crate::model::GroupKind::KINDS.iter().enumerate() {
        let n: u64 = s.contexts.iter().map(|c| c.groups_by_kind[i]).sum();
        let _ = writeln!(w, "conductor_index_cache_groups{{kind=\"{kind}\"}} {n}");
    }
    header(
        w,
        "conductor_index_unlinked_blocks_total",
        "counter",
        "Stored blocks whose parent the context never saw (keyed by their hash's alias, else the hash)",
    );
    let _ = writeln!(
        w,
        "conductor_index_unlinked_blocks_total {}",
        sum(|c| c.unlinked)
    );
    header(
        w,
        "conductor_query_duration_seconds",
        "histogram",
        "Query latency, hashing included",
    );
    for t in Transport::ALL {
        let h = &s.queries.by_transport[t as usize];
        let mut cumulative = 0;
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&h.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(
                w,
                "conductor_query_duration_seconds_bucket{{transport=\"{}\",le=\"{bound}\"}} {cumulative}",
                t.as_str()
            );
        }
        let count = h.count.load(Ordering::Relaxed);
        let _ = writeln!(
            w,
            "conductor_query_duration_seconds_bucket{{transport=\"{}\",le=\"+Inf\"}} {count}",
            t.as_str()
        );
        let sum_secs = h.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(
            w,
            "conductor_query_duration_seconds_sum{{transport=\"{}\"}} {sum_secs}",
            t.as_str()
        );
        let _ = writeln!(
            w,
            "conductor_query_duration_seconds_count{{transport=\"{}\"}} {count}",
            t.as_str()
        );
    }
    header(
        w,
        "conductor_query_errors_total",
        "counter",
        "Queries answered with an error",
    );
    let _ = writeln!(
        w,
        "conductor_query_errors_total {}",
        s.queries.errors.load(Ordering::Relaxed)
    );
    out
}

/// The memory budget's figures (see "Memory budget" in `docs/durability.md`).
pub fn render_budget(w: &mut String, budget: &crate::index::Budget) {
    gauge(
        w,
        "conductor_index_budget_bytes",
        "max_index_bytes: the bound on every context's estimated bytes together (0: none)",
        &[("", budget.max_index_bytes())],
    );
    gauge(
        w,
        "conductor_index_budget_context_blocks",
        "max_context_blocks: the bound on one context's blocks (0: none)",
        &[("", budget.max_context_blocks())],
    );
    gauge(
        w,
        "conductor_index_estimated_bytes",
        "Every context's estimated bytes, as the budget counts them (0 without a bound)",
        &[("", budget.bytes())],
    );
    header(
        w,
        "conductor_index_evicted_blocks_total",
        "counter",
        "Blocks the memory budget evicted (false misses, never stale hits); per context in /global_view",
    );
    let _ = writeln!(
        w,
        "conductor_index_evicted_blocks_total {}",
        budget.evicted()
    );
    gauge(
        w,
        "conductor_index_budget_evicting",
        "1 while the memory budget evicts (it evicted within the last minute; /health says degraded)",
        &[("", budget.degraded().is_some() as u64)],
    );
}

fn header(w: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(w, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn gauge(w: &mut String, name: &str, help: &str, values: &[(&str, u64)]) {
    header(w, name, "gauge", help);
    for (labels, v) in values {
        let _ = writeln!(w, "{name}{labels} {v}");
    }
}

/// Escape a label value.
pub fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
