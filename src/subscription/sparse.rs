//! Stores of KV-cache groups that skip blocks of the range they store: a sliding window's or a
//! Mamba group's null blocks (`docs/engine-events.md`, "Cache groups"). vLLM lists only the
//! hashes such a group keeps while its `token_ids` cover the whole range, so where each kept
//! block sits is not on the wire. The full-attention group's store of the same step names every
//! block of the same range (same parent, block size, tokens): the sparse store's hashes are a
//! subsequence of it, which places them.

use std::collections::HashMap;

use crate::events::{BlockContents, EngineStored, EventTokens, KvEvent};

/// Where a sparse store's blocks sit in the range it stores: every block's hash and contents,
/// and which of them the store holds.
pub struct Placement {
    pub hashes: Vec<crate::model::BlockHash>,
    pub contents: BlockContents,
    pub present: Vec<bool>,
}

/// A store whose tokens cover more blocks than it publishes hashes: a sliding-window or Mamba
/// group skipping its null blocks (`docs/engine-events.md`, "Cache groups").
pub fn sparse(stored: &EngineStored) -> bool {
    let blocks = match &stored.tokens {
        Some(EventTokens::Flat(t)) => t.len(),
        Some(EventTokens::Bigram(p)) => p.len(),
        None => return false,
    } / (stored.block_size.max(1) as usize);
    stored.hashes.len() < blocks
}

/// Per element of `all`, whether it is in `some`, when `some` is a subsequence of `all`.
fn subsequence_mask(
    all: &[crate::model::BlockHash],
    some: &[crate::model::BlockHash],
) -> Option<Vec<bool>> {
    let mut rest = some.iter().peekable();
    let mask: Vec<bool> = all
        .iter()
        .map(|h| rest.next_if(|s| *s == h).is_some())
        .collect();
    rest.peek().is_none().then_some(mask)
}

/// For each sparse store of `events` (see [`sparse`]), by index: the index of the store of the
/// same batch for the same range (same parent, block size, tokens, salt and adapter) that
/// publishes every block, as the full-attention group of the same step does, and which of its
/// blocks the sparse store keeps. The sparse store's hashes must be that store's, in order.
pub fn siblings(events: &[KvEvent]) -> HashMap<usize, (usize, Vec<bool>)> {
    let mut out = HashMap::new();
    let stores = || {
        events.iter().enumerate().filter_map(|(i, e)| match e {
            KvEvent::Stored(s) => Some((i, s)),
            _ => None,
        })
    };
    if !stores().any(|(_, s)| sparse(s)) {
        return out;
    }
    for (at, stored) in stores().filter(|(_, s)| sparse(s)) {
        let sibling = stores().find(|(_, d)| {
            !sparse(d)
                && d.parent == stored.parent
                && d.block_size == stored.block_size
                && d.tokens == stored.tokens
                && d.cache_salt == stored.cache_salt
                && d.lora_name == stored.lora_name
        });
        let Some((index, sibling)) = sibling else {
            continue;
        };
        if let Some(present) = subsequence_mask(&sibling.hashes, &stored.hashes) {
            out.insert(at, (index, present));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BlockHash, Tier};

    fn store(hashes: &[u64], parent: Option<u64>, tokens: usize) -> KvEvent {
        KvEvent::Stored(EngineStored {
            hashes: hashes.iter().map(|&h| BlockHash(h)).collect(),
            parent: parent.map(BlockHash),
            tokens: Some(EventTokens::Flat((0..tokens as i64).collect())),
            block_size: 4,
            lora_name: None,
            cache_salt: None,
            extras: Vec::new(),
            extras_carried: true,
            tier: Tier::Device,
            group: Default::default(),
        })
    }

    #[test]
    fn a_sparse_store_is_placed_by_its_full_sibling_of_the_same_range() {
        let events = vec![
            // The window group first (Gemma's group 0): the last two of four blocks.
            store(&[13, 14], Some(10), 16),
            store(&[11, 12, 13, 14], Some(10), 16),
            // Another range: a sibling of another parent does not place it.
            store(&[22], Some(20), 8),
            store(&[21, 22], Some(99), 8),
            // Hashes that are not a subsequence of the sibling's: not placed.
            store(&[34, 33], Some(30), 16),
            store(&[31, 32, 33, 34], Some(30), 16),
        ];
        assert!(sparse(match &events[0] {
            KvEvent::Stored(s) => s,
            _ => unreachable!(),
        }));
        let placed = siblings(&events);
        assert_eq!(placed.get(&0), Some(&(1, vec![false, false, true, true])));
        assert_eq!(placed.len(), 1, "{placed:?}");
        assert!(
            siblings(&events[1..2]).is_empty(),
            "no sparse store, nothing to place"
        );
    }
}
