//! Mooncake Conductor: a global KV-cache prefix indexer.
//!
//! Layout: [`model`] domain newtypes; [`error`] the stable result codes; [`hashing`] byte-exact
//! engine hash chains; [`wire`] publisher payload decoders; [`events`] normalized events;
//! [`index`] per-context prefix indexes; [`subscription`] one actor per publisher; [`registry`]
//! subscriptions and contexts; [`replica`] a new replica's bootstrap from a peer's snapshot;
//! [`gateway`] gRPC and HTTP over one operation layer; [`metrics`] Prometheus text; [`service`]
//! the running service; [`config`] its configuration; [`fixture`] recorded event fixtures
//! (`record`, `play`, `check`).

pub mod admin;
pub mod config;
pub mod error;
pub mod events;
pub mod fixture;
pub mod gateway;
pub mod hashing;
pub mod index;
pub mod metrics;
pub mod model;
pub mod persistence;
pub mod registry;
pub mod replica;
pub mod service;
pub mod storage;
pub mod subscription;
pub mod wire;

#[cfg(test)]
mod test_rng;
