//! The records a context hands to checkpoints and snapshots and takes back at restore: plain
//! records (`image`, `records`), a context's snapshot (`snapshot`) and its export (`export`).

pub mod export;
pub(in crate::index) mod image;
pub(in crate::index) mod records;
pub(in crate::index) mod snapshot;
