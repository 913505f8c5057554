//! The derived keys of a chained store (see "Keys" in the module doc of [`super`]).

use crate::events::BlockContents;
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
