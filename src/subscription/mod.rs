//! One subscription per registered publisher: ZeroMQ sockets, the sequence state machine, decoding,
//! and routing of normalized events to the context indexes.

pub mod state;

#[cfg(test)]
mod state_tests;
