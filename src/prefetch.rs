//! A cache-line prefetch hint, for the hot loops that know which lines they will read next
//! (the block table's walk, the derived-key chain's tokens).

/// Ask the CPU to bring the cache line of `p` into its caches. A hint only: nothing is read,
/// and any address, even a dangling one, is allowed.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
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
