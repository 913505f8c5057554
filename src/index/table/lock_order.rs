//! The lock order (invariant I4 in `src/index/README.md`), checked in builds with debug
//! assertions: the set lists' lock is the innermost one. A thread that holds it takes no shard
//! lock and not the sets' writer mutex, so no thread can wait for a shard (or the mutex) while
//! another waits for the lists. Every test that reaches those locks runs the check; the binary
//! users run compiles it out (`cfg!(debug_assertions)` is a constant there).

use std::cell::Cell;
use std::ops::{Deref, DerefMut};

thread_local! {
    /// Guards of the set lists' lock this thread holds.
    static LISTS_HELD: Cell<u32> = const { Cell::new(0) };
}

/// A guard of the set lists' lock, counted while it lives.
pub(super) struct Innermost<G> {
    guard: G,
}

impl<G> Innermost<G> {
    #[inline(always)]
    pub(super) fn new(guard: G) -> Self {
        if cfg!(debug_assertions) {
            LISTS_HELD.with(|held| held.set(held.get() + 1));
        }
        Innermost { guard }
    }
}

impl<G> Drop for Innermost<G> {
    #[inline(always)]
    fn drop(&mut self) {
        if cfg!(debug_assertions) {
            LISTS_HELD.with(|held| held.set(held.get().saturating_sub(1)));
        }
    }
}

impl<G: Deref> Deref for Innermost<G> {
    type Target = G::Target;
    #[inline(always)]
    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<G: DerefMut> DerefMut for Innermost<G> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

/// Call before taking `lock`, a shard lock or the sets' writer mutex.
#[inline(always)]
pub(super) fn outer(lock: &str) {
    if cfg!(debug_assertions) {
        LISTS_HELD.with(|held| {
            assert_eq!(
                held.get(),
                0,
                "{lock} taken while this thread holds the set lists' lock: the lock order \
                 (I4 in src/index/README.md) keeps that lock innermost"
            )
        });
    }
}
