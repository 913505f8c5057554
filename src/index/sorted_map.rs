//! A map kept as one vector of entries sorted by key: the shape of a query answer.
//!
//! An answer is built once per plan in key order and then only read in order or written in
//! place ([`crate::index::IndexReader::query_into`] fills the counts of a previous answer), so a sorted
//! vector gives what a `BTreeMap` gave (ordered iteration, lookup by key) while iterating and
//! filling a 64 x 2 answer touches a few contiguous cache lines instead of walking tree nodes.
//! Inserting keeps the order by shifting; answers are small and built in order, so that stays
//! cheap.

use std::borrow::Borrow;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SortedMap<K, V> {
    entries: Vec<(K, V)>,
}

impl<K, V> Default for SortedMap<K, V> {
    fn default() -> Self {
        SortedMap {
            entries: Vec::new(),
        }
    }
}

impl<K: Ord, V> SortedMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    fn find<Q: Ord + ?Sized>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
    {
        self.entries.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    /// Insert or replace; returns the value `key` had.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            Err(i) => {
                self.entries.insert(i, (key, value));
                None
            }
        }
    }

    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|i| &self.entries[i].1)
    }

    pub fn get_mut<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|i| &mut self.entries[i].1)
    }

    pub fn get_key_value<Q: Ord + ?Sized>(&self, key: &Q) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|i| {
            let (k, v) = &self.entries[i];
            (k, v)
        })
    }

    pub fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.find(key).is_ok()
    }

    /// The value of `key`, inserted as `V::default()` when absent.
    pub fn get_or_insert_default(&mut self, key: K) -> &mut V
    where
        V: Default,
    {
        let i = match self.find(&key) {
            Ok(i) => i,
            Err(i) => {
                self.entries.insert(i, (key, V::default()));
                i
            }
        };
        &mut self.entries[i].1
    }
}

impl<K, V> SortedMap<K, V> {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &V)> + ExactSizeIterator + Clone {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub fn iter_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = (&K, &mut V)> + ExactSizeIterator {
        self.entries.iter_mut().map(|(k, v)| (&*k, v))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator + Clone {
        self.entries.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator + Clone {
        self.entries.iter().map(|(_, v)| v)
    }

    pub fn values_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut V> + ExactSizeIterator {
        self.entries.iter_mut().map(|(_, v)| v)
    }

    /// The entries in key order.
    pub fn as_slice(&self) -> &[(K, V)] {
        &self.entries
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for SortedMap<K, V> {
    /// Like collecting into a `BTreeMap`: for a key given twice, the later value wins.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut entries: Vec<(K, V)> = iter.into_iter().collect();
        // Stable, so equal keys keep their order and the last of each run is the later value.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(K, V)> = Vec::with_capacity(entries.len());
        for e in entries {
            match out.last_mut() {
                Some(last) if last.0 == e.0 => *last = e,
                _ => out.push(e),
            }
        }
        SortedMap { entries: out }
    }
}

/// Like `BTreeMap`'s: panics when the key is absent (for tests and known keys; answer code uses
/// [`SortedMap::get`]).
impl<K: Ord + Borrow<Q>, Q: Ord + ?Sized, V> std::ops::Index<&Q> for SortedMap<K, V> {
    type Output = V;
    fn index(&self, key: &Q) -> &V {
        self.get(key).expect("no entry for this key")
    }
}

impl<K, V> IntoIterator for SortedMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<'a, K, V> IntoIterator for &'a SortedMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(k, v)| (k, v))
    }
}

#[cfg(test)]
mod tests {
    use crate::index::SortedMap;
    use std::collections::BTreeMap;

    #[test]
    fn behaves_like_a_btreemap() {
        let mut rng = crate::test_rng::Rng(0x50_47ed);
        for _ in 0..200 {
            let mut ours = SortedMap::new();
            let mut theirs = BTreeMap::new();
            for _ in 0..rng.below(40) {
                let (k, v) = (rng.below(30) as u32, rng.below(1000));
                assert_eq!(ours.insert(k, v), theirs.insert(k, v));
            }
            assert!(ours.iter().eq(theirs.iter()));
            for k in 0..32u32 {
                assert_eq!(ours.get(&k), theirs.get(&k));
                assert_eq!(ours.contains_key(&k), theirs.contains_key(&k));
            }
            let pairs: Vec<(u32, u64)> = (0..rng.below(40))
                .map(|_| (rng.below(20) as u32, rng.below(1000) as u64))
                .collect();
            let ours: SortedMap<u32, u64> = pairs.iter().copied().collect();
            let theirs: BTreeMap<u32, u64> = pairs.iter().copied().collect();
            assert!(ours.iter().eq(theirs.iter()), "{pairs:?}");
            assert_eq!(ours.len(), theirs.len());
        }
    }

    #[test]
    fn lookup_by_borrowed_key() {
        let mut m: SortedMap<String, u32> = SortedMap::new();
        m.insert("b".into(), 2);
        m.insert("a".into(), 1);
        *m.get_or_insert_default("c".into()) += 3;
        assert_eq!(m.get("a"), Some(&1));
        assert_eq!(m.get_key_value("c"), Some((&"c".to_string(), &3)));
        assert_eq!(
            m.keys().map(String::as_str).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert_eq!(m.get("z"), None);
    }
}
