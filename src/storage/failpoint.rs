//! Named crash points for the crash tests, compiled only with the `failpoints` feature (test
//! builds enable it; `scripts/run.sh`'s build does not, and there [`hit`] is an empty inline
//! function).
//!
//! `CONDUCTOR_FAILPOINT=<name>:<n>` makes the process kill itself with SIGKILL the `n`-th time
//! (from 1) it reaches the point `<name>`: no destructor runs and nothing is flushed, as when an
//! operator or the kernel kills it. The points:
//!
//! | name | where |
//! |---|---|
//! | `store_write` | after any write to the key-value store returned (checkpoint rounds, registrations, migrations) |
//! | `checkpoint_before_write` | a checkpoint round assembled, before its write |
//! | `checkpoint_after_write` | a checkpoint round's write returned |

#[cfg(feature = "failpoints")]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct Armed {
        name: String,
        at: u64,
        hits: AtomicU64,
    }

    fn armed() -> Option<&'static Armed> {
        static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
        ARMED
            .get_or_init(|| {
                let spec = std::env::var("CONDUCTOR_FAILPOINT").ok()?;
                let (name, at) = spec.rsplit_once(':')?;
                Some(Armed {
                    name: name.to_owned(),
                    at: at.parse().ok()?,
                    hits: AtomicU64::new(0),
                })
            })
            .as_ref()
    }

    pub fn hit(name: &str) {
        let Some(armed) = armed().filter(|a| a.name == name) else {
            return;
        };
        if armed.hits.fetch_add(1, Ordering::SeqCst) + 1 == armed.at {
            eprintln!("failpoint {name}:{} reached: killing the process", armed.at);
            // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }
}

/// Reach the crash point `name` (see the module doc).
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    armed::hit(name);
}

/// Reach the crash point `name`: nothing in a build without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}
