//! Each engine's description and load are read on the engine's own schedule, never in rounds
//! that wait for the slowest read: a healthy engine is read again about one interval after its
//! last read ended, whatever other engines do (`docs/engine-discovery.md`, "Keeping in step").
//!
//! Reads run in two lanes of bounded concurrency: engines whose last read went well take the
//! fast lane, engines whose last read failed (refused, timed out, unreadable) the slow lane,
//! which has half the slots. An engine that stops answering holds a fast slot for one read
//! timeout at most, then moves to the slow lane, where it also waits longer between reads
//! (the interval doubled per failure, at most [`MAX_BACKOFF`] times): any number of slow engines
//! leave the fast lane to the healthy ones, and the outbound connections stay within both
//! lanes' slots.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How often due reads are looked for: a read starts at most this late.
pub const TICK: Duration = Duration::from_millis(50);
/// The most an engine's interval is multiplied by while its reads fail.
pub const MAX_BACKOFF: u32 = 8;

/// When one kind of read (description or load) of one engine is due, and how it went.
#[derive(Debug, Clone, Copy)]
pub struct Due {
    pub next: Instant,
    /// A read is running.
    pub running: bool,
    /// Reads failed in a row.
    pub failures: u32,
}

impl Default for Due {
    fn default() -> Self {
        Due {
            next: Instant::now(),
            running: false,
            failures: 0,
        }
    }
}

impl Due {
    pub fn is_due(&self, now: Instant) -> bool {
        !self.running && self.next <= now
    }

    /// A read ended (`ok` or not): the next is one interval later, longer after failures.
    pub fn done(&mut self, ok: bool, interval: Duration, now: Instant) {
        self.running = false;
        self.failures = if ok {
            0
        } else {
            self.failures.saturating_add(1)
        };
        let factor = 1u32.checked_shl(self.failures).unwrap_or(u32::MAX);
        self.next = now + interval * factor.min(MAX_BACKOFF);
    }
}

/// The read slots: a fast lane for engines whose last read went well, a slow lane with half
/// as many for the others.
pub struct Lanes {
    fast: Arc<Semaphore>,
    slow: Arc<Semaphore>,
}

impl Lanes {
    pub fn new(slots: usize) -> Lanes {
        Lanes {
            fast: Arc::new(Semaphore::new(slots.max(1))),
            slow: Arc::new(Semaphore::new((slots / 2).max(1))),
        }
    }

    /// A slot in the lane of an engine whose last read `failed`, if one is free now.
    pub fn try_slot(&self, failed: bool) -> Option<OwnedSemaphorePermit> {
        let lane = if failed { &self.slow } else { &self.fast };
        Arc::clone(lane).try_acquire_owned().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_back_off_up_to_the_bound_and_a_success_resets() {
        let mut due = Due::default();
        let (interval, now) = (Duration::from_secs(1), Instant::now());
        assert!(due.is_due(now), "a new engine is read at once");
        due.running = true;
        assert!(!due.is_due(now), "a running read is not due again");
        let mut waits = Vec::new();
        for _ in 0..6 {
            due.done(false, interval, now);
            waits.push((due.next - now).as_secs());
        }
        assert_eq!(waits, [2, 4, 8, 8, 8, 8]);
        due.done(true, interval, now);
        assert_eq!(due.next - now, interval);
        assert_eq!(due.failures, 0);
    }

    #[test]
    fn the_slow_lane_has_half_the_slots_and_never_takes_the_fast_ones() {
        let lanes = Lanes::new(4);
        let slow: Vec<_> = (0..2).map(|_| lanes.try_slot(true).unwrap()).collect();
        assert!(lanes.try_slot(true).is_none(), "the slow lane is full");
        let fast: Vec<_> = (0..4).map(|_| lanes.try_slot(false).unwrap()).collect();
        assert!(lanes.try_slot(false).is_none());
        drop(slow);
        assert!(
            lanes.try_slot(false).is_none(),
            "a slow slot freed is not a fast one"
        );
        drop(fast);
        assert!(lanes.try_slot(false).is_some());
    }
}
