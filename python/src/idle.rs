//! The client's runtime, and what runs its connection between calls.
//!
//! The runtime is single-threaded so that a call runs entirely on the caller's thread: the caller
//! blocked in `block_on` drives the I/O driver and the connection's task itself, and no other
//! thread has to wake up for a request to leave or for its answer to be read (on a multi-threaded
//! runtime the driver belongs to a worker, which wakes the caller for every answer: measured,
//! that kept the Python call's p50 where tonic's channel had it).
//!
//! But between calls nobody would run the connection: the server's pings would go unanswered
//! (h2's graceful shutdown waits for that answer, so a stopping server would wait for an idle
//! client), and a GOAWAY or a closed connection would be noticed only by the next call, which
//! would then fail instead of reconnecting first. So a small thread looks in every [`TICK`]: it
//! enters the runtime briefly, lets the I/O driver report what arrived and the connection's task
//! handle it, and leaves. It holds the runtime for microseconds; a call that starts meanwhile
//! polls its own future on its own thread until the runtime is free.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::runtime::Runtime;

/// How often the idle connection is looked at: what a stopping server waits at most for an idle
/// client's answer to its ping, and how soon a closed connection is known to be closed.
pub(crate) const TICK: Duration = Duration::from_millis(25);

/// A single-threaded runtime with its idle thread; the thread ends once the runtime is dropped.
pub(crate) fn runtime() -> std::io::Result<Arc<Runtime>> {
    let rt = Arc::new(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
    );
    let weak = Arc::downgrade(&rt);
    std::thread::Builder::new()
        .name("conductor-idle".into())
        .spawn(move || look_in_every_tick(weak))?;
    Ok(rt)
}

fn look_in_every_tick(rt: Weak<Runtime>) {
    loop {
        std::thread::sleep(TICK);
        let Some(rt) = rt.upgrade() else {
            return;
        };
        rt.block_on(async {
            // The first yield lets the I/O driver report what arrived since the last look and
            // wake the tasks it is for; the second lets those tasks run before this one ends.
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
        });
    }
}
