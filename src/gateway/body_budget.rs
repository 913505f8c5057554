//! A budget of bytes for large HTTP request bodies held at once, so that a burst of big bodies
//! (each legal alone) cannot add up to more memory than the operator allowed.
//!
//! Bodies up to [`LARGE_BODY_BYTES`] take no share: queries are kilobytes, and making them wait
//! behind a few uploads would let slow uploads starve the query path. A larger body takes its
//! size (at most the whole budget, so that one body at the limit can still run alone) from a
//! fair semaphore before it is read, and keeps it until its request is answered, decoded values
//! included. A request that cannot get its share within [`WAIT`] is refused, not queued
//! further: a client sending slowly must not hold others back forever.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bodies up to this size take no share of the budget.
pub const LARGE_BODY_BYTES: usize = 1 << 20;

/// How long a large body waits for its share before the request is refused.
pub const WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct BodyBudget {
    semaphore: Arc<Semaphore>,
    total: u32,
}

/// A share held until dropped (`None` inside: a small body, nothing held).
#[derive(Debug)]
pub struct Share {
    _permit: Option<OwnedSemaphorePermit>,
}

/// The budget stayed exhausted for [`WAIT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

impl BodyBudget {
    /// A budget of `total_bytes` (saturating at 4 GiB, the semaphore's largest single grant).
    pub fn new(total_bytes: u64) -> Self {
        let total = u32::try_from(total_bytes).unwrap_or(u32::MAX);
        BodyBudget {
            semaphore: Arc::new(Semaphore::new(total as usize)),
            total,
        }
    }

    /// The share a body of `len` bytes takes.
    pub fn share_of(&self, len: usize) -> u32 {
        if len <= LARGE_BODY_BYTES {
            0
        } else {
            u32::try_from(len).unwrap_or(u32::MAX).min(self.total)
        }
    }

    /// Take the share of a body of `len` bytes, waiting at most `wait`.
    pub async fn reserve(&self, len: usize, wait: Duration) -> Result<Share, Busy> {
        let share = self.share_of(len);
        if share == 0 {
            return Ok(Share { _permit: None });
        }
        let acquire = self.semaphore.clone().acquire_many_owned(share);
        match tokio::time::timeout(wait, acquire).await {
            Ok(Ok(permit)) => Ok(Share {
                _permit: Some(permit),
            }),
            // Never closed; a timeout is the only failure.
            _ => Err(Busy),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_bodies_take_nothing_and_large_ones_their_size_up_to_the_whole() {
        let budget = BodyBudget::new(8 << 20);
        assert_eq!(budget.share_of(0), 0);
        assert_eq!(budget.share_of(LARGE_BODY_BYTES), 0);
        assert_eq!(budget.share_of(LARGE_BODY_BYTES + 1), (1 << 20) + 1);
        assert_eq!(budget.share_of(100 << 20), 8 << 20);
        assert_eq!(BodyBudget::new(u64::MAX).share_of(usize::MAX), u32::MAX);
    }

    #[tokio::test]
    async fn a_large_body_waits_for_room_and_is_refused_when_none_comes() {
        let budget = BodyBudget::new(5 << 20);
        let first = budget.reserve(3 << 20, WAIT).await.expect("room");
        let short = Duration::from_millis(20);
        assert_eq!(budget.reserve(3 << 20, short).await.unwrap_err(), Busy);
        // Small bodies pass while the budget is taken.
        budget.reserve(4096, short).await.expect("small body");
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.reserve(3 << 20, WAIT).await }
        });
        tokio::time::sleep(short).await;
        drop(first);
        waiting
            .await
            .unwrap()
            .expect("room once the first is answered");
    }
}
