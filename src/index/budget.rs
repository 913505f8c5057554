//! The index's memory budget (see "Memory budget" in `docs/durability.md`): a bound on the
//! estimated bytes of every context together (`max_index_bytes`) and on the blocks of one context
//! (`max_context_blocks`). Past either, the context that grew evicts blocks down to
//! [`LOW_WATER_PERCENT`] of the bound, oldest chain first and deepest block first
//! (`evict_order`), so that answers shrink to a shorter true prefix.
//!
//! Shared by every context of a service; each context charges its estimate here after each
//! batch ([`Charge`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Eviction frees down to this share of the bound that was passed, so it runs once per tenth of
/// the bound's growth rather than on every batch.
pub const LOW_WATER_PERCENT: u64 = 90;

/// Estimated bytes per distinct block: its table slot and record (about 16 with the table's
/// slack), its alias (about 24 with the alias map's slack) and its place in the eviction order
/// (8, plus a run's share).
pub const BYTES_PER_BLOCK: u64 = 56;
/// Estimated bytes per (block, holder) pair beyond the first: a reverse-list reference and a
/// larger interned holder set.
pub const BYTES_PER_PAIR: u64 = 8;

/// How long `/health` says degraded after the budget evicted.
pub const DEGRADED_FOR: Duration = Duration::from_secs(60);

/// Evictions are logged at most once per this interval (with the count since the last line).
const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The default of `max_index_bytes`: half of the machine's physical memory (`MemTotal` of
/// `/proc/meminfo`), which leaves the rest to the process's other memory and the host; 0 (no
/// bound) where that cannot be read.
pub fn default_max_index_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib.saturating_mul(1024) / 2)
        })
        .unwrap_or(0)
}

/// The bounds and what eviction did, shared by every context (see the module doc).
#[derive(Debug)]
pub struct Budget {
    max_index_bytes: u64,
    max_context_blocks: u64,
    /// Every context's estimate, summed.
    bytes: AtomicU64,
    /// Blocks evicted, every context together.
    evicted: AtomicU64,
    /// Milliseconds after `started` of the last eviction, plus one (0: never).
    last_eviction: AtomicU64,
    /// Milliseconds after `started` of the last log line, and evictions since it.
    last_log: AtomicU64,
    unlogged: AtomicU64,
    started: Instant,
}

impl Budget {
    /// `max_index_bytes` and `max_context_blocks`, each 0 for no bound.
    pub fn new(max_index_bytes: u64, max_context_blocks: u64) -> Self {
        Budget {
            max_index_bytes,
            max_context_blocks,
            bytes: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            last_eviction: AtomicU64::new(0),
            last_log: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    /// No bound: contexts keep no eviction order and pay nothing.
    pub fn unbounded() -> Arc<Self> {
        Arc::new(Budget::new(0, 0))
    }

    pub fn is_bounded(&self) -> bool {
        self.max_index_bytes > 0 || self.max_context_blocks > 0
    }

    pub fn max_index_bytes(&self) -> u64 {
        self.max_index_bytes
    }

    pub fn max_context_blocks(&self) -> u64 {
        self.max_context_blocks
    }

    /// Every context's estimated bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Blocks evicted so far, every context together.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Why `/health` says degraded: the budget evicted within [`DEGRADED_FOR`].
    pub fn degraded(&self) -> Option<String> {
        let last = self.last_eviction.load(Ordering::Relaxed);
        if last == 0 {
            return None;
        }
        let ago = self.now_ms().saturating_sub(last - 1);
        (ago < DEGRADED_FOR.as_millis() as u64).then(|| {
            format!(
                "memory budget evicting: {} blocks evicted so far, the last {} s ago \
                 (max_index_bytes {}, max_context_blocks {}); answers are shorter prefixes",
                self.evicted(),
                ago / 1000,
                self.max_index_bytes,
                self.max_context_blocks
            )
        })
    }

    /// The blocks a context of `blocks` blocks and estimated `own` bytes keeps after eviction,
    /// `None` when it is within both bounds.
    pub(super) fn target(&self, blocks: u64, own: u64) -> Option<(u64, &'static str)> {
        let mut target = None;
        if self.max_context_blocks > 0 && blocks > self.max_context_blocks {
            target = Some((
                self.max_context_blocks * LOW_WATER_PERCENT / 100,
                "max_context_blocks",
            ));
        }
        let total = self.bytes();
        if self.max_index_bytes > 0 && total > self.max_index_bytes && own > 0 {
            // This context's share of the low-water mark, in proportion to its size: every
            // context that grows past the bound shrinks by the same factor.
            let low = self.max_index_bytes * LOW_WATER_PERCENT / 100;
            let keep = (u128::from(blocks) * u128::from(low) / u128::from(total)) as u64;
            if target.is_none_or(|(t, _)| keep < t) {
                target = Some((keep, "max_index_bytes"));
            }
        }
        target
    }

    /// Count `n` blocks evicted from `context` because of `bound`; logs at most once per
    /// [`LOG_INTERVAL`].
    pub(super) fn note_evicted(&self, context: &crate::model::ContextKey, n: u64, bound: &str) {
        if n == 0 {
            return;
        }
        self.evicted.fetch_add(n, Ordering::Relaxed);
        let now = self.now_ms();
        self.last_eviction.store(now + 1, Ordering::Relaxed);
        let unlogged = self.unlogged.fetch_add(n, Ordering::Relaxed) + n;
        let last = self.last_log.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last - 1) >= LOG_INTERVAL.as_millis() as u64;
        if due
            && self
                .last_log
                .compare_exchange(last, now + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.unlogged.fetch_sub(unlogged, Ordering::Relaxed);
            tracing::warn!(
                "memory budget: evicted {unlogged} blocks since the last report (the latest from \
                 context {context:?}, past {bound}); {} evicted in all, index estimate {} bytes",
                self.evicted(),
                self.bytes()
            );
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

/// What one context has added to [`Budget::bytes`]; given back when the context goes.
pub(super) struct Charge {
    pub(super) budget: Arc<Budget>,
    bytes: u64,
}

impl Charge {
    pub(super) fn new(budget: Arc<Budget>) -> Self {
        Charge { budget, bytes: 0 }
    }

    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The context's estimate is now `bytes`.
    pub(super) fn set(&mut self, bytes: u64) {
        if bytes >= self.bytes {
            self.budget
                .bytes
                .fetch_add(bytes - self.bytes, Ordering::Relaxed);
        } else {
            self.budget
                .bytes
                .fetch_sub(self.bytes - bytes, Ordering::Relaxed);
        }
        self.bytes = bytes;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.set(0);
    }
}

/// A context's estimated bytes (see [`BYTES_PER_BLOCK`]).
pub(super) fn estimate(blocks: u64, pairs: u64) -> u64 {
    blocks * BYTES_PER_BLOCK + pairs.saturating_sub(blocks) * BYTES_PER_PAIR
}
