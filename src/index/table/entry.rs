//! A holder set's entries and what a change did: the tier bits, the inline entry
//! (`holder_id << 4 | tier_bits`) and the outcomes of adds and removes.

use crate::model::Tier;

pub(crate) const DEVICE: u8 = 1;
pub(crate) const CPU_LOCAL: u8 = 2;
pub(crate) const CPU_SHARE: u8 = 4;
pub(crate) const DISK: u8 = 8;
pub(crate) const ALL_TIERS: u8 = DEVICE | CPU_LOCAL | CPU_SHARE | DISK;

/// Tier bits an engine (instance, rank) holder may carry.
pub(crate) const ENGINE_TIERS: u8 = DEVICE | CPU_LOCAL | DISK;
/// Tier bits a shared (Mooncake backend) holder may carry.
pub(crate) const SHARED_TIERS: u8 = CPU_SHARE | DISK;

/// Holder ids must fit the 28 bits above the tier bits of an entry.
pub(crate) const MAX_HOLDERS: usize = 1 << 28;

pub(crate) const fn tier_bit(tier: Tier) -> u8 {
    match tier {
        Tier::Device => DEVICE,
        Tier::CpuLocal => CPU_LOCAL,
        Tier::CpuShare => CPU_SHARE,
        Tier::Disk => DISK,
    }
}

#[inline]
pub(crate) const fn entry_id(entry: u32) -> u32 {
    entry >> 4
}

#[inline]
pub(crate) const fn entry_bits(entry: u32) -> u8 {
    (entry & 0xF) as u8
}

#[inline]
pub(crate) const fn make_entry(id: u32, bits: u8) -> u32 {
    (id << 4) | (bits & ALL_TIERS) as u32
}

/// What an insertion changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Added {
    /// The holder had no entry on this block before.
    pub new_holder: bool,
    /// The block was absent from the table before.
    pub new_block: bool,
    /// The holder already had every one of these tier bits on this block: a repeated
    /// announcement, which the caller counts (see `ContextIndex`'s repeat counts).
    pub repeat: bool,
}

/// What a removal changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Removed {
    /// The holder's entry on this block disappeared (its last tier bit went).
    pub holder_gone: bool,
    /// The block disappeared from the table (its last holder went).
    pub block_gone: bool,
}

pub(super) const KEPT: Added = Added {
    new_holder: false,
    new_block: false,
    repeat: false,
};
pub(super) const REPEATED: Added = Added {
    new_holder: false,
    new_block: false,
    repeat: true,
};
/// The outcome of merging entry `new` into the same holder's entry `old`.
#[inline]
pub(super) const fn kept_or_repeated(old: u32, new: u32) -> Added {
    if entry_bits(old) & entry_bits(new) == entry_bits(new) {
        REPEATED
    } else {
        KEPT
    }
}

/// What a join that changed nothing (`to == from`) or changed the set means: a join that kept
/// the set without adding the holder found every bit already there, a repeat.
#[inline]
pub(super) const fn joined_outcome(from: u32, to: u32, joined: bool) -> Added {
    match (joined, from == to) {
        (true, _) => JOINED,
        (false, true) => REPEATED,
        (false, false) => KEPT,
    }
}

pub(super) const JOINED: Added = Added {
    new_holder: true,
    new_block: false,
    repeat: false,
};
pub(super) const GONE_HOLDER: Removed = Removed {
    holder_gone: true,
    block_gone: false,
};
pub(super) const GONE_BLOCK: Removed = Removed {
    holder_gone: true,
    block_gone: true,
};

/// Inline value `val` with tier `bits` of holder `id` cleared; `None` when nothing is left.
pub(super) fn leave_inline(val: u32, id: u32, bits: u8) -> (Option<u32>, Removed) {
    if entry_id(val) != id {
        return (Some(val), Removed::default());
    }
    match entry_bits(val) & !bits {
        0 => (None, GONE_BLOCK),
        left => (Some(make_entry(id, left)), Removed::default()),
    }
}
