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
//! Replaced arrays are kept until the table's reader count is 0: a reader registers
//! ([`Table::reading`](super::Table::reading)) before it loads any arrays pointer, and the writer
//! reads the count after publishing the new pointer, both sequentially consistent, so either
//! the writer sees the reader and keeps the old arrays, or the reader sees the new pointer.
//! While readers never pause, replaced arrays wait; each shard's retired arrays add up to less
//! than twice its current ones (growth is geometric), and go at the next write section that
//! finds no reader.

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence};

use std::sync::RwLockWriteGuard;

use super::Shard;
use super::blocks::Arrays;

/// One shard's version (odd while its writer is inside a write section) and current arrays.
pub(super) struct ShardView {
    version: AtomicU64,
    arrays: AtomicPtr<Arrays>,
}

impl ShardView {
    pub(super) fn new(arrays: *const Arrays) -> Self {
        ShardView {
            version: AtomicU64::new(0),
            arrays: AtomicPtr::new(arrays.cast_mut()),
        }
    }

    /// Under the shard's write lock, before changing anything.
    pub(super) fn begin_write(&self) {
        let v = self.version.load(Ordering::Relaxed);
        self.version.store(v | 1, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Under the shard's write lock, after the changes: publish the arrays readers use from now
    /// on, then the new even version.
    pub(super) fn end_write(&self, arrays: *const Arrays) {
        self.arrays.store(arrays.cast_mut(), Ordering::SeqCst);
        let v = self.version.load(Ordering::Relaxed);
        self.version.store((v | 1) + 1, Ordering::Release);
    }

    /// Run `f` over a consistent view of the shard: `f` may see a torn state and must tolerate
    /// it (no panic, bounded time), but only a run with no write in between is returned. Call
    /// only inside a [`Reading`] of the table.
    #[inline]
    pub(super) fn read<R>(&self, _reading: &Reading<'_>, mut f: impl FnMut(&Arrays) -> R) -> R {
        loop {
            let v = self.version.load(Ordering::Acquire);
            if v & 1 == 0 {
                let p = self.arrays.load(Ordering::SeqCst);
                // SAFETY: `p` is a shard's current or replaced arrays: published by
                // `end_write` from an `Arc` the shard's `Blocks` owns, and replaced ones are
                // dropped only while the table has no `Reading`, which `_reading` proves there
                // is (see the module doc). Only atomic cells are read through it.
                let r = f(unsafe { &*p });
                fence(Ordering::Acquire);
                if self.version.load(Ordering::Relaxed) == v {
                    return r;
                }
            }
            std::hint::spin_loop();
        }
    }
}

impl ShardView {
    /// The shard's arrays as they are now, unvalidated: for prefetch hints, which may read a torn
    /// state (it only aims a hint). Alive for as long as `_reading` is, like every arrays pointer
    /// loaded after the reader registered (see the module doc).
    #[inline]
    pub(super) fn arrays<'r>(&self, _reading: &'r Reading<'_>) -> &'r Arrays {
        let p = self.arrays.load(Ordering::SeqCst);
        // SAFETY: as in `read`: loaded after `_reading` registered, so not freed before it ends.
        unsafe { &*p }
    }
}

/// A registered lock-free reader of a table; while any exists, replaced arrays stay.
pub(crate) struct Reading<'a> {
    readers: &'a AtomicUsize,
}

impl<'a> Reading<'a> {
    pub(super) fn new(readers: &'a AtomicUsize) -> Self {
        readers.fetch_add(1, Ordering::SeqCst);
        Reading { readers }
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.readers.fetch_sub(1, Ordering::Release);
    }
}

/// Whether replaced arrays may be freed: after `end_write` published the new pointer.
pub(super) fn no_readers(readers: &AtomicUsize) -> bool {
    readers.load(Ordering::SeqCst) == 0
}

/// A shard under its write lock, inside a write section of its view: ending the section (also
/// on unwind) publishes the shard's arrays and frees replaced ones when no lock-free reader can
/// hold them.
pub(super) struct ShardWrite<'a> {
    pub(super) guard: RwLockWriteGuard<'a, Shard>,
    pub(super) view: &'a ShardView,
    pub(super) readers: &'a AtomicUsize,
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
        self.view.end_write(self.guard.blocks.arrays_ptr());
        if self.guard.blocks.has_retired() && no_readers(self.readers) {
            self.guard.blocks.drop_retired();
        }
    }
}
