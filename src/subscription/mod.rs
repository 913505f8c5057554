//! One subscription per registered publisher: ZeroMQ sockets, the sequence state machine, decoding,
//! and routing of normalized events to the context indexes.
//!
//! Layout: [`state`] the pure sequence state machine; [`socket`] the SUB/DEALER tasks;
//! [`route`] decoded events → per-context index batches; [`marks`] the source's position for
//! the contexts it fed; [`hash_check`] the runtime profile check;
//! [`status`] what a subscription reports; [`actor`] the actix shell tying them together.

pub mod actor;
pub mod hash_check;
pub mod marks;
pub mod route;
pub mod socket;
pub mod state;
pub mod status;

#[cfg(test)]
mod state_tests;
