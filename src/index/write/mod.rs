//! The write side: the context's single writer (`context`), its per-holder state (`holder`)
//! and reverse lists (`refs`), keying of engine and store blocks (`keying`), a store run
//! (`store_run`) and the eviction order of the memory budget (`evict_order`).

pub mod context;
pub(in crate::index) mod evict_order;
pub(in crate::index) mod holder;
pub(in crate::index) mod keying;
pub(in crate::index) mod refs;
pub(in crate::index) mod store_run;
