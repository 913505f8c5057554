//! The read side: what a query walks and answers. The cached plan and answer template
//! (`plan`), the cursors per listed holder (`cursors`), the walk (`query`) and its look-ahead
//! (`lookahead`), the keys of a prompt (`prompt_keys`), the answer types (`answer`), the read
//! handle (`handle`) and the sorted map answers are built in (`sorted_map`). Nothing here
//! changes the index; it imports nothing from `write` or `stored`.

pub(in crate::index) mod cursors;
pub mod handle;
pub mod hybrid;
pub(in crate::index) mod lookahead;
pub(in crate::index) mod prompt_keys;
pub mod query;
