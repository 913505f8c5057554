//! Bringing a block's cache lines in before the walk gets to it.
//!
//! A walk step costs two dependent cache misses (the block's slot, then its record), and the
//! shard lock's atomic instructions order every load before them, so on their own the misses of
//! consecutive blocks never overlap. Prefetch instructions are not ordered by locked
//! instructions, so the walk asks for the lines of the blocks a few steps ahead:
//!
//! - the slot line, without any lock: each shard publishes where its slot array lives
//!   ([`SlotView`]) whenever its writer may have moved it. A reader that sees an old address
//!   prefetches a line that is no longer the slot; that costs one useless prefetch, never a
//!   wrong answer, because the walk still reads every block under the shard lock;
//! - the record line, under the shard lock, once the slot is in cache
//!   (`ShardRead::prefetch_record`).

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// Ask the CPU to bring the cache line of `p` into its caches. A hint only: nothing is read,
/// and any address, even a dangling one, is allowed.
#[inline(always)]
pub(super) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 never faults and has no effect a program can observe except timing;
    // the pointer is never dereferenced.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Where one shard's slot array lives, published by its writer for lock-free prefetching.
pub(super) struct SlotView {
    ptr: AtomicPtr<u32>,
    len: AtomicUsize,
}

impl SlotView {
    pub(super) fn new() -> Self {
        SlotView {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            len: AtomicUsize::new(0),
        }
    }

    /// Called under the shard's write lock after anything that may have moved the slots.
    pub(super) fn publish(&self, (ptr, len): (*const u32, usize)) {
        self.ptr.store(ptr.cast_mut(), Ordering::Relaxed);
        self.len.store(len, Ordering::Relaxed);
    }

    /// Prefetch the slot at the position `home(len)` gives.
    #[inline]
    pub(super) fn prefetch_slot(&self, home: impl FnOnce(usize) -> usize) {
        let len = self.len.load(Ordering::Relaxed);
        if len == 0 {
            return;
        }
        // A torn pair (new address, old length) only aims the hint elsewhere: `wrapping_add`
        // keeps the arithmetic defined whatever the values.
        let ptr = self.ptr.load(Ordering::Relaxed);
        prefetch(ptr.cast_const().wrapping_add(home(len)));
    }
}
