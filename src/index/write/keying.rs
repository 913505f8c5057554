//! The derived keys of a chained store (see "Keys" in `src/index/README.md`).

use crate::events::{BlockContents, IndexOp};
use crate::hashing::derived;
use crate::model::BlockHash;

use crate::index::aliases::Aliases;

/// Alias pairs (engine hash, derived key) gathered by a batch's stores, inserted into the alias
/// map when the batch's gathered stores are applied (see [`super::store_run`]), in order.
///
/// Why deferred: an insert is a random access into a map of about one entry per block, and
/// done per store op right after prefetching its 8-16 lines, the lines had not arrived yet
/// (the insert's load was 60 % of its time). Gathered for the whole run, their lines are
/// prefetched when the op is keyed and read after every other store of the batch was keyed.
#[derive(Default)]
pub(in crate::index) struct PendingAliases {
    pub(in crate::index) pairs: Vec<(u64, u64)>,
}

impl PendingAliases {
    /// Insert the gathered pairs (recording changed hashes in `changed`) and empty the list.
    pub(in crate::index) fn flush(&mut self, aliases: &Aliases, changed: &mut Vec<u64>) {
        if !self.pairs.is_empty() {
            aliases.insert_all(&self.pairs, changed);
            self.pairs.clear();
        }
    }

    /// The derived key `hash` has as an alias, the gathered pairs included. The parent of a
    /// store is nearly always the last block of the store before it, the last gathered pair;
    /// any other hash is looked up in the map after flushing, so the answer is the map's.
    fn get(&mut self, aliases: &Aliases, hash: u64, changed: &mut Vec<u64>) -> Option<u64> {
        match self.pairs.last() {
            Some(&(last, key)) if last == hash => Some(key),
            _ => {
                self.flush(aliases, changed);
                aliases.get(hash)
            }
        }
    }
}

/// Append to `keys` the derived key of each block of a store that published `hashes` with
/// `contents`: its parent's key (the root, or the alias of the published parent) linked with each
/// block's content in turn. False (and `keys` as it was) when the parent is a hash this context
/// has no alias for, or the contents do not name one block per hash.
pub(in crate::index) fn chain(
    tuning: derived::ChainTuning,
    aliases: &Aliases,
    pending: &mut PendingAliases,
    changed: &mut Vec<u64>,
    hashes: &[BlockHash],
    contents: &BlockContents,
    keys: &mut Vec<u64>,
) -> bool {
    if contents.digests.len() != hashes.len() {
        return false;
    }
    let parent = match contents.parent {
        None => Some(contents.root),
        Some(p) => pending.get(aliases, p.0, changed),
    };
    let Some(mut parent) = parent else {
        return false;
    };
    keys.extend(contents.digests.iter().map(|&c| {
        parent = derived::link_tuned(tuning, parent, c);
        parent
    }));
    true
}

/// What keying one store op found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(in crate::index) struct Keyed {
    /// Blocks keyed by derived keys whose hashes became aliases.
    pub translated: u64,
    /// Blocks of a chained store whose parent the context never saw.
    pub unlinked: u64,
}

/// Where keying a store op writes: the alias map and the pairs gathered for it, the hashes
/// whose alias changed, and the op's table keys.
pub(in crate::index) struct KeyOut<'a> {
    pub aliases: &'a Aliases,
    pub pending: &'a mut PendingAliases,
    pub changed: &'a mut Vec<u64>,
    /// Per block: its table key, and whether that key is the published hash itself (emptied
    /// first).
    pub keys: &'a mut Vec<(u64, bool)>,
    /// Scratch for a chain's derived keys.
    pub derived: &'a mut Vec<u64>,
    /// The context's chain tuning.
    pub tuning: derived::ChainTuning,
}

/// The table keys of a store op's blocks into `out.keys`, each flagged when it is a published
/// hash (see "Keys" in `src/index/README.md`): derived keys for a chained store whose
/// parent is known (its hashes become aliases, gathered in `out.pending`), an alias's key or the
/// hash itself for an aliased store and for a chained store whose parent is unknown, the hashes
/// themselves for a plain store. Other ops have no keys.
pub(in crate::index) fn store_keys(op: &IndexOp, out: KeyOut<'_>) -> Keyed {
    let KeyOut {
        aliases,
        pending,
        changed,
        keys,
        derived,
        tuning,
    } = out;
    keys.clear();
    let raw = |keys: &mut Vec<(u64, bool)>, hashes: &[BlockHash]| {
        keys.extend(hashes.iter().map(|h| (h.0, true)));
    };
    let aliased = |keys: &mut Vec<(u64, bool)>,
                   pending: &mut PendingAliases,
                   changed: &mut Vec<u64>,
                   hashes: &[BlockHash]| {
        // The map must answer with every alias gathered so far.
        pending.flush(aliases, changed);
        aliases.resolve_with(hashes.iter().map(|h| h.0), |h, alias| {
            keys.push(alias.map_or((h, true), |k| (k, false)));
        });
    };
    let mut keyed = Keyed::default();
    match op {
        IndexOp::StoreChained {
            hashes, contents, ..
        } => {
            derived.clear();
            if chain(tuning, aliases, pending, changed, hashes, contents, derived) {
                aliases.prefetch(hashes.iter().map(|h| h.0));
                pending
                    .pairs
                    .extend(hashes.iter().map(|h| h.0).zip(derived.iter().copied()));
                keyed.translated = derived.len() as u64;
                keys.extend(derived.iter().map(|&k| (k, false)));
            } else {
                // A parent never seen: the blocks are keyed as an aliased store's (a hash that
                // has an alias names that block; any other stays keyed by itself, which only a
                // matching registered profile reproduces, until an alias names it).
                keyed.unlinked = hashes.len() as u64;
                aliased(keys, pending, changed, hashes);
            }
        }
        IndexOp::StoreSparse {
            hashes,
            contents,
            present,
            ..
        } => {
            // The whole range is keyed (and its hashes become aliases), as the store of the
            // group that holds every block of it does; only the blocks present are stored.
            derived.clear();
            if present.len() == hashes.len()
                && chain(tuning, aliases, pending, changed, hashes, contents, derived)
            {
                pending
                    .pairs
                    .extend(hashes.iter().map(|h| h.0).zip(derived.iter().copied()));
                let kept = derived.iter().zip(present).filter(|(_, p)| **p);
                keys.extend(kept.map(|(&k, _)| (k, false)));
                keyed.translated = keys.len() as u64;
            } else {
                let held: Vec<BlockHash> = hashes
                    .iter()
                    .zip(present)
                    .filter(|(_, p)| **p)
                    .map(|(h, _)| *h)
                    .collect();
                keyed.unlinked = held.len() as u64;
                aliased(keys, pending, changed, &held);
            }
        }
        IndexOp::StoreAliased { hashes, .. } => aliased(keys, pending, changed, hashes),
        IndexOp::Store { hashes, .. } => raw(keys, hashes),
        IndexOp::Remove { .. } | IndexOp::ClearHolder { .. } | IndexOp::GroupKind { .. } => {}
    }
    keyed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chained(
        aliases: &Aliases,
        pending: &mut PendingAliases,
        hashes: &[BlockHash],
        contents: &BlockContents,
    ) -> Option<Vec<u64>> {
        let mut keys = Vec::new();
        chain(
            derived::ChainTuning::DEFAULT,
            aliases,
            pending,
            &mut Vec::new(),
            hashes,
            contents,
            &mut keys,
        )
        .then_some(keys)
    }

    #[test]
    fn a_chain_starts_at_the_root_or_a_known_parent() {
        let aliases = Aliases::default();
        let mut pending = PendingAliases::default();
        let contents = |parent: Option<u64>| BlockContents {
            parent: parent.map(BlockHash),
            root: derived::ROOT,
            digests: vec![11, 12],
        };
        let hashes = [BlockHash(1), BlockHash(2)];
        let keys = chained(&aliases, &mut pending, &hashes, &contents(None)).unwrap();
        let k0 = derived::link(derived::ROOT, 11);
        assert_eq!(keys, [k0, derived::link(k0, 12)]);
        assert_eq!(
            chained(&aliases, &mut pending, &hashes, &contents(Some(2))),
            None,
            "unknown parent"
        );
        aliases.insert([(2, keys[1])].into_iter(), &mut Vec::new());
        let next = chained(&aliases, &mut pending, &hashes, &contents(Some(2))).unwrap();
        assert_eq!(next[0], derived::link(keys[1], 11));
        let short = BlockContents {
            digests: vec![11],
            ..contents(None)
        };
        assert_eq!(
            chained(&aliases, &mut pending, &hashes, &short),
            None,
            "one digest per hash"
        );
    }

    #[test]
    fn a_parent_among_the_gathered_aliases_is_found_and_its_pairs_reach_the_map_in_order() {
        let aliases = Aliases::default();
        let mut pending = PendingAliases::default();
        // 5 was gathered twice: the later key is its alias. 7 is gathered but not last.
        pending.pairs.extend([(5, 51), (7, 71), (5, 53)]);
        let contents = |parent: u64| BlockContents {
            parent: Some(BlockHash(parent)),
            root: derived::ROOT,
            digests: vec![11],
        };
        let mut changed = Vec::new();
        let mut keys = Vec::new();
        assert!(chain(
            derived::ChainTuning::DEFAULT,
            &aliases,
            &mut pending,
            &mut changed,
            &[BlockHash(9)],
            &contents(5),
            &mut keys
        ));
        assert_eq!(keys, [derived::link(53, 11)], "the last pair of 5");
        assert_eq!(pending.pairs.len(), 3, "found without flushing");
        keys.clear();
        assert!(chain(
            derived::ChainTuning::DEFAULT,
            &aliases,
            &mut pending,
            &mut changed,
            &[BlockHash(9)],
            &contents(7),
            &mut keys
        ));
        assert_eq!(keys, [derived::link(71, 11)]);
        assert!(pending.pairs.is_empty(), "flushed to answer from the map");
        assert_eq!(
            changed,
            [5, 7, 5],
            "every insert that set or moved an alias"
        );
        assert_eq!((aliases.get(5), aliases.get(7)), (Some(53), Some(71)));
    }
}
