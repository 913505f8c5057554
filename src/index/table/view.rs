//! Reading a shard without its lock: a sequence lock over the shard's [`Arrays`], and the
//! reader count that decides when replaced arrays may be freed.
//!
//! Why: the walk reads one block per step from a random shard. Under a `RwLock` each step would
//! cost two atomic read-modify-writes on the shard's lock word, and on x86 those order every
//! load before them, so the cache misses of consecutive steps could never overlap (figures:
//! `docs/performance.md`, "Index: lock-free block lookups"). With a sequence lock a step is a
//! few plain loads: read the version, read the block, read the version again, and retry if a
//! write happened in between. The writer still holds the shard's `RwLock` while it writes, so
//! writers exclude each other and every other reader still locks.
//!
//! Memory safety: a reader may be inside an [`Arrays`] while the writer replaces it (growth).
//! Replaced arrays are kept until the table's reader count is 0, by the protocol in
//! [`seqlock`](super::seqlock) (readers register before they load a pointer; the writer
//! publishes before it looks for readers), which the loom model checks. This file holds the
//! shard's side of it: the write section ([`ShardWrite`]), which frees retired arrays only when
//! [`no_readers`] says so. A [`Reading`] keeps only its own table's arrays alive, so the table
//! refuses another table's (`Table::view`).
//!
//! Write sections are short: a shard grows before its section opens (`Table::write`), so a
//! section never holds a rehash, and a reader that still finds one open after
//! [`SPINS_BEFORE_YIELD`](super::seqlock::SPINS_BEFORE_YIELD) spins (its writer descheduled
//! inside it) yields its thread instead of spinning on.
//! While readers never pause, replaced arrays wait; each shard's retired arrays add up to less
//! than twice its current ones (growth is geometric), and go at the next write section that
//! finds no reader.

use std::sync::RwLockWriteGuard;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::Shard;
use super::blocks::Arrays;
pub(crate) use super::seqlock::Reading;
use super::seqlock::{SeqView, no_readers};

/// One shard's version (odd while its writer is inside a write section) and current arrays.
pub(super) struct ShardView(SeqView<Arrays>);

impl ShardView {
    pub(super) fn new(arrays: *const Arrays) -> Self {
        ShardView(SeqView::new(arrays))
    }

    /// Under the shard's write lock, before changing anything.
    pub(super) fn begin_write(&self) {
        self.0.begin_write();
    }

    /// Run `f` over a consistent view of the shard: `f` may see a torn state and must tolerate
    /// it (no panic, bounded time), but only a run with no write in between is returned. Only
    /// atomic cells are read through the arrays.
    #[inline]
    pub(super) fn read<R>(&self, reading: &Reading<'_>, f: impl FnMut(&Arrays) -> R) -> R {
        // SAFETY: `reading` is registered with the table's count (`Table::view` checks it is
        // this table's), every arrays pointer `end_write` publishes comes from an `Arc` the
        // shard's `Blocks` owns, and replaced ones are dropped only after `no_readers` (in
        // `ShardWrite`'s drop).
        unsafe { self.0.read(reading, f) }
    }

    /// The shard's arrays as they are now, unvalidated: for prefetch hints, which may read a torn
    /// state (it only aims a hint). Alive for as long as `reading` is.
    #[inline]
    pub(super) fn arrays<'r>(&self, reading: &'r Reading<'_>) -> &'r Arrays {
        // SAFETY: as in `read`.
        unsafe { self.0.current(reading) }
    }
}

/// A shard under its write lock, inside a write section of its view: ending the section (also
/// on unwind) publishes the shard's arrays and frees replaced ones when no lock-free reader can
/// hold them.
pub(super) struct ShardWrite<'a> {
    pub(super) guard: RwLockWriteGuard<'a, Shard>,
    pub(super) view: &'a ShardView,
    pub(super) readers: &'a AtomicUsize,
    /// Set when a panic unwinds through the section (see [`ShardWrite`]'s `Drop`).
    pub(super) broken: &'a AtomicBool,
}

impl std::ops::Deref for ShardWrite<'_> {
    type Target = Shard;
    fn deref(&self) -> &Shard {
        &self.guard
    }
}

impl std::ops::DerefMut for ShardWrite<'_> {
    fn deref_mut(&mut self) -> &mut Shard {
        &mut self.guard
    }
}

impl Drop for ShardWrite<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Invariant: nothing inside a write section panics. Should a bug break it, the
            // shard may be half-changed (a shift cut short), so the table answers no block from
            // now on: a false miss (logged) rather than a hit the shard cannot vouch for. The
            // section still ends so that no reader waits on it for ever.
            self.broken.store(true, Ordering::Release);
            tracing::error!(
                "a panic inside a block table's write section: the context answers no hits until it is rebuilt"
            );
        }
        self.view.0.end_write(self.guard.blocks.arrays_ptr());
        if self.guard.blocks.has_retired() && no_readers(self.readers) {
            self.guard.blocks.drop_retired();
        }
    }
}
