//! The block table's lock-free read protocol (`src/index/table/seqlock.rs`, the very file the
//! service compiles) run under loom, which tries every interleaving of a reader and a writer
//! that the C11 memory model allows (up to its preemption bound) and reports a read of memory
//! the writer freed as a causality violation.
//!
//! `cargo test --release -p mooncake-conductor-loom` (the test script runs it).

#![allow(unsafe_code)] // Dereferences of the model's published pointers, as the table does.

/// The atomics `seqlock` is written against: loom's.
mod sync {
    pub use loom::hint::spin_loop;
    pub use loom::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence};
    pub use loom::thread::yield_now;
}

#[path = "../../src/index/table/seqlock.rs"]
pub mod seqlock;

#[cfg(test)]
mod tests;
