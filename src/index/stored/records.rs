//! The shapes a context hands its checkpoint and its snapshot: one pair's tier bits, one rank
//! listing.

use crate::model::SubscriptionKey;

/// The tier bits a holder has on a block now (`bits == 0`: the pair is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PairBits {
    /// The holder's id within its context.
    pub holder: u32,
    pub block: u64,
    pub bits: u8,
}

/// `source` lists (`instance_id`, `dp_rank`) in a context (its registration, or an engine source
/// storing there). Ordered by source, then instance, then rank.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attachment {
    pub source: SubscriptionKey,
    pub instance_id: String,
    pub dp_rank: u32,
}
