//! Mooncake Conductor: a global KV-cache prefix indexer.
//!
//! Modules, in dependency order: each uses only modules listed before it (checked by
//! `scripts/check-deps.py`; `docs/ARCHITECTURE.md` has the data flow and where each concept
//! lives).
//!
//! - [`error`] the stable result codes; [`hashing`] byte-exact engine hash chains and the
//!   [`hashing::BlockHash`] they yield; [`storage`] the key-value layer (trait, RocksDB, memory,
//!   migrations); [`mix`] the splitmix64 finalizer and [`test_rng`] the seeded generator built
//!   on it (for tests and benchmarks); [`prefetch`] the cache-line hint of the hot loops;
//!   [`cache_line`] a value alone on its cache lines. These use no other module but `mix`,
//!   `prefetch` and `cache_line`.
//! - [`model`] domain newtypes (context and subscription keys, tiers, registrations).
//! - [`events`] normalized events; [`wire`] publisher payload decoders into them.
//! - [`index`] per-context prefix indexes, their actors and the directory of live contexts.
//! - [`subscription`] one actor per publisher, and the directory of running subscriptions.
//! - [`durability`] checkpoints, recovery, the record format, opening the data directory.
//! - [`registry`] registrations: policy, lifecycle, sharing through etcd.
//! - [`metrics`] Prometheus text of the registry's and the indexes' figures.
//! - [`gateway`] gRPC and HTTP over one operation layer.
//! - [`engines`] engines registered by their URL: their own descriptions of their DP ranks,
//!   read and followed.
//! - [`config`] the service configuration (it builds the settings of the modules above),
//!   [`config_connections`] its keys of the servers' connections, [`config_engines`] those of
//!   engines registered by URL and [`config_replica`] those of a replica's bootstrap and
//!   snapshot export.
//! - [`replica`] a new replica's bootstrap from a peer's snapshot (served and pulled).
//! - [`service`] the running service.
//! - [`admin`] offline commands on a data directory; [`fixture`] recorded event fixtures
//!   (`record`, `play`, `check`).

pub mod admin;
pub mod cache_line;
pub mod config;
pub mod config_connections;
pub mod config_engines;
pub mod config_replica;
pub mod durability;
pub mod engines;
pub mod error;
pub mod events;
pub mod fixture;
pub mod gateway;
pub mod hashing;
pub mod index;
pub mod metrics;
pub mod mix;
pub mod model;
#[allow(unsafe_code)] // A CPU hint that reads nothing (see the file).
pub mod prefetch;
pub mod registry;
pub mod replica;
pub mod service;
pub mod storage;
pub mod subscription;
pub mod wire;

pub mod test_rng;
