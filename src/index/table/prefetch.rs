//! Bringing a block's cache lines in before the walk gets to it.
//!
//! A walk step costs two dependent cache misses (the block's slot, then its record). The walk
//! asks for the lines of the blocks a few steps ahead (`query::PREFETCH_AHEAD`), so the misses of
//! consecutive blocks overlap instead of adding up: the slot line first, then, once that is in,
//! the record line its slot names.

/// Ask the CPU to bring the cache line of `p` into its caches. A hint only: nothing is read,
/// and any address, even a dangling one, is allowed.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
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
