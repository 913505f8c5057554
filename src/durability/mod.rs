//! Durable state: what the Conductor writes to the key-value store ([`crate::storage`]) and reads
//! back at start-up. [`checkpoint`] runs the rounds, each one atomic write of every context's
//! changes and the source records; [`sources`] keeps registrations with their incarnations and
//! the position each source resumes from; [`codec`] is the byte format of every record;
//! [`recovery`] rebuilds the contexts and registrations from a store; [`load`](mod@load) opens
//! the data directory at start-up (migrations, recovery, the policy for unreadable data).
//! Registrations are written by [`sources::put_registration`] when they are accepted, not at
//! checkpoints. The invariant all of it keeps is in `docs/durability.md`, "One consistent cut".
//!
//! What a context hands to a checkpoint and takes back at recovery
//! ([`crate::index::ContextChanges`], [`crate::index::Restorer`]) stays in the index: producing
//! it reads the index's private structure, which this module never sees.
//!
//! # Layout (column families)
//!
//! | cf | key | value |
//! |---|---|---|
//! | `meta` | `schema_version` | u32 BE |
//! | `registrations` | service key text | JSON registration (Python names, hash profile inputs, `incarnation`) |
//! | `contexts` | context id (8 B) | JSON context key + hash profile inputs |
//! | `holders` | ctx id + holder id (u32 BE) | JSON holder record (ids of reclaimed holders are gaps) |
//! | `attachments` | ctx id + n (u32 BE) | JSON (source, instance, rank) |
//! | `watermarks` | ctx id + source key text | the source's position: seq (u64 BE) + payload digest (u64 BE) |
//! | `pairs` | ctx id + holder id (u32 BE) + block (u64 BE) | tier bits (1 B), then per tier announced more than once: its bit (1 B) + the announcements beyond the first (u32 BE) |
//! | `aliases` | ctx id + engine hash (u64 BE) | derived key (u64 BE) |
//! | `sources` | service key text | the registration's incarnation (u64 BE), then the source's position: seq + payload digest (u64 BE each) |
//!
//! The RocksDB store keeps the `pairs` and `aliases` records packed, many to a RocksDB value
//! ([`crate::storage::packed`], schema 4); the keys and values above are still what is written
//! and read, one record at a time.
//!
//! The context id is the first 8 bytes of SHA-256 over the context key, so it is stable across
//! restarts without an allocation table. One checkpoint round is one atomic write, of what
//! changed only (nothing for an idle context or an unmoved source).

pub mod checkpoint;
pub mod codec;
pub mod load;
pub mod recovery;
pub mod sources;

pub use load::{Loaded, OnCorruptData, load};

#[cfg(test)]
mod cut_tests;
#[cfg(test)]
mod tests;
