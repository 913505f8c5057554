//! The registry: owns the set of subscriptions and the context directory.
//!
//! One actor serializes registration changes (so a registration and an unregistration of one
//! service key can never interleave); queries never pass through it (they read the
//! [`ContextDirectory`] directly).

pub mod actor;
pub mod contexts;
pub mod policy;
pub mod shared;
pub mod state;
pub mod subscriptions;

pub use actor::{
    ApplyShared, ListServices, Origin, Refusals, Register, RegisterOutcome, Registry, ServiceInfo,
    ShutdownAll, Unregister,
};
pub use contexts::{ArbiterPool, ContextDirectory, ProfileConflict};
pub use subscriptions::SubscriptionDirectory;
