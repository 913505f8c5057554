//! Mooncake Conductor: a global KV-cache prefix indexer.
//!
//! Layout: [`model`] domain newtypes; [`error`] the stable result codes; [`hashing`] byte-exact
//! engine hash chains; [`wire`] publisher payload decoders; [`events`] normalized events;
//! [`index`] per-context prefix indexes; [`config`] the service configuration.

pub mod config;
pub mod error;
pub mod events;
pub mod hashing;
pub mod index;
pub mod model;
pub mod service;
pub mod subscription;
pub mod wire;
