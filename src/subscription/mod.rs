//! One subscription per registered publisher: ZeroMQ sockets, the sequence state machine, decoding,
//! and routing of normalized events to the context indexes.
//!
//! Layout: [`state`] the pure sequence state machine; [`socket`] the SUB/DEALER tasks over
//! [`zmtp`], our bounded ZeroMQ reader; [`route`] decoded events → per-context index batches;
//! [`ingest`] one payload decoded, rank-checked and routed (shared with `check`); [`ingest_step`]
//! what the actor does with one payload, as data (batches, status change, warnings);
//! [`marks`] the source's position for the contexts it fed; [`hash_check`] the runtime profile
//! check; [`plain_proof`] whether an event that leaves its extras out may have derived keys
//! (used by [`route`]); [`status`] what a subscription reports; [`warn_limit`] rate-limited warnings;
//! [`settings`] its bounds; [`actor`] the actix shell tying them together; [`directory`] the
//! running subscriptions by key.

pub mod actor;
pub mod directory;
pub mod hash_check;
pub mod ingest;
pub mod ingest_step;
pub mod marks;
pub mod plain_proof;
pub mod route;
pub mod settings;
pub mod socket;
pub mod sparse;
pub mod state;
pub mod status;
pub mod warn_limit;
pub mod zmtp;

#[cfg(test)]
mod state_tests;
