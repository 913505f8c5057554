//! The lock-free read protocol of a shard, on its own: a sequence lock over a pointer to the
//! shard's current arrays, and the reader count that decides when replaced arrays may be freed.
//! Generic over what the pointer names and free of the rest of the crate, so that the loom model
//! (`loom-model/`, see `src/index/README.md`) checks this very file with loom's atomics.
//!
//! The protocol (the invariants are numbered in `src/index/README.md`):
//! - **Readers register before they load a pointer.** [`Reading::new`] counts the reader, then
//!   passes a sequentially consistent fence; every pointer load of that reader comes after.
//! - **The writer publishes before it looks for readers.** [`SeqView::end_write`] stores the new
//!   pointer; [`no_readers`] passes a sequentially consistent fence, then reads the count. The
//!   two fences are totally ordered: either the count sees the reader (the old arrays stay), or
//!   the reader's load sees the new pointer (it never reaches the old arrays).
//! - **A leaving reader releases what it read.** The count's decrement is a release, and
//!   [`no_readers`]' read an acquire: a reader's reads of old arrays come before their free.
//! - **Torn reads are tolerated, never returned.** The version is odd inside a write section;
//!   [`SeqView::read`] returns only a run that saw the same even version before and after.

use super::sync::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence, spin_loop, yield_now};

/// Spins of a reader on a shard in a write section before it yields its thread: a section
/// shifts at most one run of slots (growth happens before it opens), far less than this.
pub const SPINS_BEFORE_YIELD: u32 = 128;

/// A version (odd inside a write section) and the pointer readers follow.
pub struct SeqView<T> {
    version: AtomicU64,
    current: AtomicPtr<T>,
}

impl<T> SeqView<T> {
    pub fn new(current: *const T) -> Self {
        SeqView {
            version: AtomicU64::new(0),
            current: AtomicPtr::new(current.cast_mut()),
        }
    }

    /// Under the writer's lock, before changing anything.
    pub fn begin_write(&self) {
        let v = self.version.load(Ordering::Relaxed);
        self.version.store(v | 1, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Under the writer's lock, after the changes: publish the pointer readers follow from now
    /// on, then the new even version. Follow with [`no_readers`] before freeing what the old
    /// pointer named.
    pub fn end_write(&self, current: *const T) {
        self.current.store(current.cast_mut(), Ordering::Release);
        let v = self.version.load(Ordering::Relaxed);
        self.version.store((v | 1) + 1, Ordering::Release);
    }

    /// Run `f` over a consistent view: `f` may see a torn state and must tolerate it (no panic,
    /// bounded time), but only a run with no write in between is returned.
    ///
    /// # Safety
    ///
    /// `reading` must be registered with the count the writer checks before freeing anything
    /// this view's pointer named, and every pointer `end_write` published must stay valid until
    /// that check finds no reader.
    #[inline]
    pub unsafe fn read<R>(&self, _reading: &Reading<'_>, mut f: impl FnMut(&T) -> R) -> R {
        let mut spins = 0u32;
        loop {
            let v = self.version.load(Ordering::Acquire);
            if v & 1 == 0 {
                let p = self.current.load(Ordering::Acquire);
                // SAFETY: loaded after `_reading` registered (it exists), so by the caller's
                // contract and the protocol above not freed before `_reading` ends.
                let r = f(unsafe { &*p });
                fence(Ordering::Acquire);
                if self.version.load(Ordering::Relaxed) == v {
                    return r;
                }
            }
            if spins < SPINS_BEFORE_YIELD {
                spins += 1;
                spin_loop();
            } else {
                yield_now();
            }
        }
    }

    /// What the pointer names now, unvalidated (a prefetch hint may read a torn state).
    ///
    /// # Safety
    ///
    /// As for [`SeqView::read`].
    #[inline]
    pub unsafe fn current<'r>(&self, _reading: &'r Reading<'_>) -> &'r T {
        let p = self.current.load(Ordering::Acquire);
        // SAFETY: as in `read`: loaded after `_reading` registered, so not freed before it ends.
        unsafe { &*p }
    }

    /// The pointer alone, with no reader registered: for the loom model's check that a load
    /// before the registration is caught. Never dereferenced by the crate.
    #[allow(dead_code)]
    pub fn load_unregistered(&self) -> *const T {
        self.current.load(Ordering::Acquire)
    }
}

/// A registered lock-free reader; while any exists, replaced arrays stay.
pub struct Reading<'a> {
    readers: &'a AtomicUsize,
}

impl<'a> Reading<'a> {
    pub fn new(readers: &'a AtomicUsize) -> Self {
        readers.fetch_add(1, Ordering::Relaxed);
        // Ordered before every pointer this reader loads (see the module doc).
        fence(Ordering::SeqCst);
        Reading { readers }
    }

    /// Whether this reader registered with `readers`.
    #[inline(always)]
    pub fn is_of(&self, readers: &AtomicUsize) -> bool {
        std::ptr::eq(self.readers, readers)
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.readers.fetch_sub(1, Ordering::Release);
    }
}

/// Whether what a replaced pointer named may be freed: call after [`SeqView::end_write`]
/// published the new one.
pub fn no_readers(readers: &AtomicUsize) -> bool {
    // Ordered after the publication (see the module doc).
    fence(Ordering::SeqCst);
    readers.load(Ordering::Acquire) == 0
}
