//! One reader and one writer that replaces the shard's arrays and frees the old ones when
//! `no_readers` allows it. The "free" is a write to a loom cell inside the old arrays, so a
//! reader that can still read them unordered with that write fails the model.

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::AtomicUsize;
use loom::thread;

use crate::seqlock::{Reading, SeqView, no_readers};

/// Stands for a shard's arrays: `cell` is read by readers and written by the free.
struct Arrays {
    cell: UnsafeCell<u64>,
}

struct Shard {
    view: SeqView<Arrays>,
    readers: AtomicUsize,
}

/// The writer's side, as `ShardWrite` does it: publish the new arrays, then free the old ones
/// only when no reader is registered.
fn replace(shard: &Shard, old: *const Arrays, new: *const Arrays) {
    shard.view.begin_write();
    shard.view.end_write(new);
    if no_readers(&shard.readers) {
        // SAFETY: the model's arrays live until the model ends; this write stands for the free.
        unsafe { &*old }.cell.with_mut(|v| unsafe { *v = 0 });
    }
}

/// Runs the model with `reader` as the reading thread; returns nothing, panics on a violation.
fn model(reader: fn(&Shard) -> u64) {
    loom::model(move || {
        let old = Box::into_raw(Box::new(Arrays {
            cell: UnsafeCell::new(1),
        }));
        let new = Box::into_raw(Box::new(Arrays {
            cell: UnsafeCell::new(2),
        }));
        let shard = Arc::new(Shard {
            view: SeqView::new(old),
            readers: AtomicUsize::new(0),
        });
        let reading = {
            let shard = shard.clone();
            thread::spawn(move || reader(&shard))
        };
        replace(&shard, old, new);
        let seen = reading.join().expect("reader");
        assert!(seen == 1 || seen == 2, "read freed arrays: {seen}");
        // SAFETY: both threads are done with them.
        unsafe {
            drop(Box::from_raw(old));
            drop(Box::from_raw(new));
        }
    });
}

/// The reader as the table's walk does it: register, then read through the view.
fn registered_reader(shard: &Shard) -> u64 {
    let reading = Reading::new(&shard.readers);
    // SAFETY: `reading` is registered with the count `replace` checks before its free.
    unsafe { shard.view.read(&reading, |a| a.cell.with(|v| *v)) }
}

/// The bug the protocol forbids: the pointer loaded before the reader registers.
fn loads_before_registering(shard: &Shard) -> u64 {
    let p = shard.view.load_unregistered();
    let _reading = Reading::new(&shard.readers);
    // SAFETY: none: this is the bug the model must catch.
    unsafe { &*p }.cell.with(|v| unsafe { *v })
}

#[test]
fn a_registered_reader_never_reads_freed_arrays() {
    model(registered_reader);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn a_pointer_loaded_before_the_registration_is_caught() {
    model(loads_before_registering);
}
