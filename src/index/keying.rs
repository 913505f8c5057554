//! The derived keys of a chained store (see "Keys" in the module doc of [`super`]).

use crate::events::{BlockContents, IndexOp};
use crate::hashing::derived;
use crate::model::BlockHash;

use super::aliases::Aliases;

/// The derived key of each block of a store that published `hashes` with `contents`: its
/// parent's key (the root, or the alias of the published parent) linked with each block's
/// content in turn. `None` when the parent is a hash this context has no alias for, or the
/// contents do not name one block per hash.
pub(super) fn chain(
    aliases: &Aliases,
    hashes: &[BlockHash],
    contents: &BlockContents,
) -> Option<Vec<u64>> {
    if contents.digests.len() != hashes.len() {
        return None;
    }
    let mut parent = match contents.parent {
        None => contents.root,
        Some(p) => aliases.get(p.0)?,
    };
    Some(
        contents
            .digests
            .iter()
            .map(|&c| {
                parent = derived::link(parent, c);
                parent
            })
            .collect(),
    )
}

/// The table keys of one store op's blocks.
pub(super) struct Keyed {
    /// Per block: its table key, and whether that key is the published hash itself.
    pub keys: Vec<(u64, bool)>,
    /// Blocks keyed by derived keys whose hashes became aliases.
    pub translated: u64,
    /// Blocks of a chained store whose parent the context never saw.
    pub unlinked: u64,
}

/// The table keys of a store op's blocks, each flagged when it is a published hash (see "Keys"
/// in the module doc of [`super`]): derived keys for a chained store whose parent is known (its
/// hashes become aliases, recorded in `changed`), an alias's key or the hash itself for an
/// aliased store, the hashes themselves for a plain store. Other ops have no keys.
pub(super) fn store_keys(aliases: &Aliases, op: &IndexOp, changed: &mut Vec<u64>) -> Keyed {
    let raw = |hashes: &[BlockHash]| hashes.iter().map(|h| (h.0, true)).collect();
    let mut out = Keyed {
        keys: Vec::new(),
        translated: 0,
        unlinked: 0,
    };
    out.keys = match op {
        IndexOp::StoreChained {
            hashes, contents, ..
        } => match chain(aliases, hashes, contents) {
            Some(keys) => {
                aliases.insert(
                    hashes.iter().map(|h| h.0).zip(keys.iter().copied()),
                    changed,
                );
                out.translated = keys.len() as u64;
                keys.into_iter().map(|k| (k, false)).collect()
            }
            None => {
                // A parent never seen: the blocks stay keyed by their hashes, which only a
                // matching registered profile reproduces.
                out.unlinked = hashes.len() as u64;
                raw(hashes)
            }
        },
        IndexOp::StoreAliased { hashes, .. } => {
            let resolved = aliases.resolve(hashes.iter().map(|h| h.0));
            hashes
                .iter()
                .zip(resolved)
                .map(|(h, alias)| alias.map_or((h.0, true), |k| (k, false)))
                .collect()
        }
        IndexOp::Store { hashes, .. } => raw(hashes),
        IndexOp::Remove { .. } | IndexOp::ClearHolder { .. } => Vec::new(),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_starts_at_the_root_or_a_known_parent() {
        let aliases = Aliases::default();
        let contents = |parent: Option<u64>| BlockContents {
            parent: parent.map(BlockHash),
            root: derived::ROOT,
            digests: vec![11, 12],
        };
        let hashes = [BlockHash(1), BlockHash(2)];
        let keys = chain(&aliases, &hashes, &contents(None)).unwrap();
        let k0 = derived::link(derived::ROOT, 11);
        assert_eq!(keys, [k0, derived::link(k0, 12)]);
        assert_eq!(
            chain(&aliases, &hashes, &contents(Some(2))),
            None,
            "unknown parent"
        );
        aliases.insert([(2, keys[1])].into_iter(), &mut Vec::new());
        let next = chain(&aliases, &hashes, &contents(Some(2))).unwrap();
        assert_eq!(next[0], derived::link(keys[1], 11));
        let short = BlockContents {
            digests: vec![11],
            ..contents(None)
        };
        assert_eq!(
            chain(&aliases, &hashes, &short),
            None,
            "one digest per hash"
        );
    }
}
