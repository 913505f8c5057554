//! The answer for a rank whose model has more than one KV-cache group, or a group that is not
//! full attention (`docs/engine-events.md`, "Cache groups"): the prefix the engine itself would
//! reuse, which vLLM decides over all groups at once (`find_longest_cache_hit` of its hybrid
//! coordinator) as a fixed point:
//!
//! - starting from the whole prompt, each group in turn (full attention first) lowers the
//!   candidate length `L` to the longest hit it accepts at or below `L`, until no group lowers
//!   it;
//! - full attention accepts the leading run of its cached blocks;
//! - a sliding window of `w` tokens accepts the rightmost boundary `L'` whose `cdiv(w - 1, B)`
//!   preceding blocks are all cached, or else the run of cached blocks from block 0;
//! - Mamba accepts the rightmost boundary `L'` whose block (the one ending there) holds a state.
//!
//! Window and Mamba residency is not prefix-closed (blocks slide out of the window, states sit
//! only where a chunk ended), so this looks past the first missing block: it collects, per group,
//! the positions of the prompt's blocks the group holds, then runs the fixed point per tier
//! (tiers stay cumulative: a block counts at a tier when held there or in a faster one). A
//! group of a kind whose rule the events cannot decide (chunked local attention: its chunk is
//! not on the wire; a kind this service does not know) does not lower `L`, so such a rank's
//! answer is an upper bound (`Plan::rank_statuses`).

use std::sync::atomic::Ordering;

use crate::hashing::PrefixKeys;
use crate::model::GroupKind;

use super::cursors::PHASE_MASK;
use crate::index::plan::{HybridCursor, Plan};
use crate::index::shared::Shared;
use crate::index::table::{entry_bits, entry_id};

/// The positions (block indexes) of the prompt's blocks one group holds, each with the tier
/// bits it is held in, in increasing order.
type Held = Vec<(usize, u8)>;

/// Write the answer of every hybrid cursor of `plan` in `selected` into `counts`.
pub(crate) fn answer<K: PrefixKeys + ?Sized>(
    shared: &Shared,
    keys: &mut K,
    plan: &Plan,
    selected: std::ops::Range<u32>,
    counts: &mut [[u64; 4]],
) {
    let cursors = &plan.hybrid;
    let chosen: Vec<bool> = cursors
        .iter()
        .map(|h| selected.contains(&h.cursor))
        .collect();
    if !chosen.contains(&true) {
        return;
    }
    // Holder id → (hybrid cursor, group), sorted by id: the plan's, built once per plan.
    let slot_of = &plan.hybrid_slots;
    let mut held: Vec<Vec<Held>> = cursors
        .iter()
        .map(|h| vec![Held::new(); h.groups.len()])
        .collect();
    let n = keys.num_blocks();
    let with_raw = shared.raw_pairs.load(Ordering::Relaxed) > 0;
    let mut entries = Vec::new();
    let reading = shared.table.reading();
    // A rank whose full-attention groups all ended their leading run can gain nothing past it:
    // its fixed point is at most that run. Stop once every chosen rank is so bounded.
    let mut bounded: Vec<bool> = chosen.iter().map(|&c| !c).collect();
    for i in 0..n {
        if bounded.iter().all(|&b| b) {
            break;
        }
        let mut found = |key: u64, entries: &mut Vec<u32>| {
            let mut at = shared.table.locate(key);
            shared.table.lookup(&reading, &mut at, |_, _| true, entries);
            for &e in entries.iter() {
                let Ok(k) = slot_of.binary_search_by_key(&entry_id(e), |&(id, _, _)| id) else {
                    continue;
                };
                let (_, c, g) = slot_of[k];
                let (c, g) = (c as usize, g as usize);
                if !chosen[c] {
                    continue;
                }
                let list = &mut held[c][g];
                match list.last_mut() {
                    Some((at, bits)) if *at == i => *bits |= entry_bits(e),
                    _ => list.push((i, entry_bits(e))),
                }
            }
        };
        let key = keys.key(i).0;
        found(key, &mut entries);
        if with_raw && let Some(alt) = keys.alt_key(i).map(|k| k.0).filter(|&k| k != key) {
            found(alt, &mut entries);
        }
        for (c, h) in cursors.iter().enumerate() {
            if bounded[c] {
                continue;
            }
            let fulls =
                (h.groups.iter().zip(&held[c])).filter(|((g, _), _)| g.kind == GroupKind::Full);
            let mut any_full = false;
            let mut all_ended = true;
            for (_, list) in fulls {
                any_full = true;
                all_ended &= list.last().is_none_or(|&(at, _)| at != i);
            }
            bounded[c] = any_full && all_ended;
        }
    }
    drop(reading);
    let block_size = shared.key.block_size.max(1) as usize;
    for (c, h) in cursors.iter().enumerate().filter(|&(c, _)| chosen[c]) {
        let Some(row) = counts.get_mut(h.cursor as usize) else {
            continue;
        };
        for (t, &mask) in PHASE_MASK.iter().enumerate() {
            let blocks = fixed_point(h, &held[c], mask, n, block_size);
            row[t] = keys.covered(blocks);
        }
    }
}

/// The engine's hit, in blocks, for a prompt of `n` blocks, over every group of `h` whose
/// blocks `held` lists, counting a block when it is held in a tier of `mask`.
pub(crate) fn fixed_point(
    h: &HybridCursor,
    held: &[Held],
    mask: u8,
    n: usize,
    block_size: usize,
) -> usize {
    let mut hit = n;
    loop {
        let before = hit;
        for ((group, _), list) in h.groups.iter().zip(held) {
            hit = group_hit(group.kind, list, mask, hit, block_size);
        }
        if hit >= before {
            return hit;
        }
    }
}

/// The longest hit, in blocks and at most `max`, that one group of `kind` accepts, from the
/// positions `held` it holds (those with a bit of `mask`).
pub(crate) fn group_hit(
    kind: GroupKind,
    held: &[(usize, u8)],
    mask: u8,
    max: usize,
    block_size: usize,
) -> usize {
    let has = |&&(_, bits): &&(usize, u8)| bits & mask != 0;
    match kind {
        GroupKind::Full => {
            let mut run = 0;
            for &(at, _) in held.iter().filter(has) {
                if at != run || run >= max {
                    break;
                }
                run += 1;
            }
            run
        }
        GroupKind::Mamba => held
            .iter()
            .filter(has)
            .rev()
            .find(|&&(at, _)| at < max)
            .map_or(0, |&(at, _)| at + 1),
        GroupKind::SlidingWindow { window } => {
            // Blocks a boundary needs before it: cdiv(window - 1, block_size).
            let need = (window as usize).saturating_sub(1).div_ceil(block_size);
            // Scan the held blocks below `max` from the right, counting consecutive ones.
            let mut count = 0usize;
            let mut next: Option<usize> = None;
            for &(at, _) in held.iter().filter(has).rev().filter(|&&(at, _)| at < max) {
                count = if next == Some(at + 1) { count + 1 } else { 1 };
                next = Some(at);
                if count >= need {
                    return at + count;
                }
            }
            // No boundary with a whole window: the run from block 0, if the scan's last run
            // reached it.
            if next == Some(0) { count } else { 0 }
        }
        GroupKind::ChunkedLocal | GroupKind::Unknown => max,
    }
}
