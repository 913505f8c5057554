//! Rate limiting of one subscription's warnings: a peer that misbehaves on every message must not
//! flood the log. Each kind of warning is logged at most once per interval; the next one logged
//! says how many were suppressed in between.

use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct WarnLimiter {
    interval: Duration,
    kinds: HashMap<&'static str, Slot>,
}

#[derive(Debug, Default)]
struct Slot {
    last_logged: Option<Instant>,
    suppressed: u64,
}

impl WarnLimiter {
    pub fn new(interval: Duration) -> Self {
        WarnLimiter {
            interval,
            kinds: HashMap::new(),
        }
    }

    /// One occurrence of `kind` at `now`: `Some(suppressed)` if it is to be logged (with the
    /// number of occurrences suppressed since the last one logged), `None` if it is suppressed.
    pub fn check(&mut self, kind: &'static str, now: Instant) -> Option<u64> {
        let slot = self.kinds.entry(kind).or_default();
        let due = slot
            .last_logged
            .is_none_or(|last| now.saturating_duration_since(last) >= self.interval);
        if due {
            slot.last_logged = Some(now);
            Some(std::mem::take(&mut slot.suppressed))
        } else {
            slot.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_per_kind_and_interval_then_the_suppressed_count() {
        let t0 = Instant::now();
        let mut limiter = WarnLimiter::new(Duration::from_secs(10));
        assert_eq!(limiter.check("a", t0), Some(0));
        for i in 1..=5 {
            assert_eq!(limiter.check("a", t0 + Duration::from_secs(i)), None);
        }
        assert_eq!(
            limiter.check("b", t0 + Duration::from_secs(1)),
            Some(0),
            "another kind has its own budget"
        );
        assert_eq!(limiter.check("a", t0 + Duration::from_secs(10)), Some(5));
        assert_eq!(limiter.check("a", t0 + Duration::from_secs(11)), None);
        assert_eq!(limiter.check("a", t0 + Duration::from_secs(30)), Some(1));
    }
}
