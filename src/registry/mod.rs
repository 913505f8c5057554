//! The registry: owns the set of subscriptions and the context directory.
//!
//! One actor serializes registration changes (so a registration and an unregistration of one
//! service key can never interleave); queries never pass through it (they read the
//! [`ContextDirectory`] directly).

pub mod actor;
pub mod policy;
pub mod shared;
pub mod state;

pub use actor::{
    ListServices, Origin, Refusals, Register, RegisterOutcome, Registry, ServiceInfo, ShutdownAll,
    Unregister,
};
// Their homes are below the registry; named here too, where callers have always found them.
pub use crate::index::directory::{ArbiterPool, ContextDirectory, ProfileConflict};
pub use crate::subscription::directory::SubscriptionDirectory;
pub use shared::sync::ApplyShared;
