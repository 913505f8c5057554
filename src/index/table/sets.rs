//! Interned holder sets: a block held by two or more holders stores the 32-bit value of an
//! immutable, refcounted set of sorted `holder_id << 4 | tier_bits` entries shared by every block
//! with exactly those entries.
//!
//! Why: the blocks of one prompt prefix are nearly always held by the same holders in the same
//! tiers (a shared system prompt is on every rank), so consecutive blocks of a query usually
//! carry the same set value and the walk advances every cursor at once without looking at the
//! holders (see `query`). It also stores each distinct set once instead of once per block.
//!
//! Values: a set's value is `(id + 1) << 4` (low 4 bits 0, never 0); a single holder stays an
//! inline entry (low 4 bits are its tier bits) and needs no set.
//!
//! Concurrency: readers see [`SetLists`] (entries by id) behind a `RwLock` the writer takes for
//! writing only to add or free a set. Everything else (refcounts, the content index, the
//! transition cache) is the single writer's and sits behind a mutex nobody else takes (a bulk
//! fill's threads take it before the context is shared). A set is freed as soon as no block
//! names it, not later. Readers stay exact anyway: a set's entries are read under the lists'
//! read lock (so the arena is not rewritten or reallocated meanwhile) and after reading a block
//! value that names it, either under that block's shard read lock (snapshots, checkpoints, the
//! writer's look-ups) or, for the query walk, inside the same validated lock-free read of the
//! shard (`Table::lookup`, see `view`). Freeing needs the last such block changed, under that
//! shard's write lock and inside a write section, so a locked reader cannot overlap it and a
//! lock-free read that overlapped it is retried. A freed id may be given to other contents;
//! [`Sets::reused`] counts that, so a reader that remembers a set value across blocks knows when
//! the value may mean something else.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use super::arena::Arena;
use super::lock_order::Innermost;
use super::set_index::SetIndex;
use super::{ALL_TIERS, Added, Removed, entry_bits, entry_id, mix64, read_lock, write_lock};
use crate::cache_line::CacheLine;

/// Set ids stay below this, so that `(id + 1) << 4` fits 32 bits.
pub(super) const MAX_SETS: u32 = (1 << 28) - 1;

/// Direct-mapped transition cache slots (about 6 KiB per context, allocated on first use).
const CACHE_SLOTS: usize = 256;

#[inline]
pub(crate) const fn is_inline(val: u32) -> bool {
    val & 0xF != 0
}

#[inline]
const fn set_value(id: u32) -> u32 {
    (id + 1) << 4
}

#[inline]
pub(super) const fn set_id(val: u32) -> u32 {
    (val >> 4).wrapping_sub(1)
}

/// Entries of every live set, read by queries.
#[derive(Default)]
pub(super) struct SetLists {
    arena: Arena,
    /// Set id → offset of its entry list in `arena`.
    offs: Vec<u32>,
}

impl SetLists {
    /// The entries behind a block value: itself when inline, else its set's sorted entries.
    #[inline]
    pub(super) fn entries(&self, val: u32) -> &[u32] {
        match self.offs.get(set_id(val) as usize) {
            Some(&off) => self.arena.list(off),
            None => &[],
        }
    }
}

/// A remembered "value `from` with op `op` applied gives `to`" (and what that changed).
#[derive(Clone, Copy, Default)]
struct Transition {
    from: u32,
    op: u32,
    /// Generation of `from`'s and `to`'s ids when remembered (0 for inline values).
    from_gen: u32,
    to_gen: u32,
    to: u32,
    /// 1 = join, 2 = leave (0 = empty slot).
    kind: u8,
    /// Join: the holder was new; leave: the holder went.
    holder_changed: bool,
}

const JOIN: u8 = 1;
const LEAVE: u8 = 2;

/// The last join that changed a block's value, taken again by the joins after it with the same
/// value and entry without looking anything up; the reference moves of all of them are applied
/// at once ([`Sets::settle`]).
///
/// Why: the blocks of one prompt carry one set value, so a holder storing the prompt moves each
/// of its blocks from that value to the same next one; the transition cache's lookup and
/// validation and the two reference counts per block were about 8 % of apply on the
/// side-by-side benchmark. While moves are pending nothing is freed (every path that frees a
/// set settles first), so the values it names keep their meaning.
#[derive(Clone, Copy)]
struct LastJoin {
    from: u32,
    op: u32,
    to: u32,
    joined: bool,
    /// Blocks moved from `from` to `to` whose references are not moved yet.
    moves: u32,
}

/// The writer's bookkeeping.
#[derive(Default)]
pub(super) struct SetWriter {
    /// Set id → blocks whose value names it; 0 = free.
    refs: Vec<u32>,
    /// Set id → times it was given to contents; a transition remembered under an older
    /// generation names other contents.
    gens: Vec<u32>,
    free: Vec<u32>,
    /// Set id → 32-bit hash of its entries, for `index`.
    hashes: Vec<u32>,
    /// Content hash → live set ids: one id per distinct entry list.
    index: SetIndex,
    cache: Vec<Transition>,
    last: Option<LastJoin>,
    scratch: Vec<u32>,
    seed: u64,
}

/// The holder sets of one context.
pub(super) struct Sets {
    /// Each on its own lines (see [`CacheLine`]): readers take `lists`' lock word and read
    /// `reused` on every lookup of a set, and only the writer takes `writer`.
    lists: CacheLine<RwLock<SetLists>>,
    writer: CacheLine<Mutex<SetWriter>>,
    reused: CacheLine<AtomicU64>,
}

impl Sets {
    pub(super) fn new(seed: u64) -> Self {
        Sets {
            lists: CacheLine(RwLock::new(SetLists::default())),
            writer: CacheLine(Mutex::new(SetWriter {
                seed,
                ..SetWriter::default()
            })),
            reused: CacheLine(AtomicU64::new(0)),
        }
    }

    pub(super) fn lists(&self) -> Innermost<std::sync::RwLockReadGuard<'_, SetLists>> {
        Innermost::new(read_lock(&self.lists))
    }

    /// How many times a freed set id was given to new contents. Read with a block value (in the
    /// same validated read of its shard): if it equals the figure read with an earlier block's
    /// (equal) value, both values name the same entries.
    #[inline]
    pub(super) fn reused(&self) -> u64 {
        self.reused.load(Ordering::Acquire)
    }

    pub(super) fn writer(&self) -> MutexGuard<'_, SetWriter> {
        super::lock_order::outer("the sets' writer mutex");
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tier bits of holder `id` in block value `val`.
    pub(super) fn bits_of(&self, val: u32, id: u32) -> u8 {
        if is_inline(val) {
            return if entry_id(val) == id {
                entry_bits(val)
            } else {
                0
            };
        }
        let lists = self.lists();
        let list = lists.entries(val);
        find(list, id).map_or(0, |pos| entry_bits(list[pos]))
    }

    /// `val` (a live block's value) with tier `bits` of holder `id` added. A refused join (set
    /// or arena limit) keeps `val`.
    pub(super) fn join(&self, w: &mut SetWriter, val: u32, id: u32, bits: u8) -> (u32, Added) {
        let new = super::make_entry(id, bits);
        if is_inline(val) && entry_id(val) == id {
            return (val | new, super::kept_or_repeated(val, new));
        }
        if let Some(last) = w.last.as_mut()
            && last.from == val
            && last.op == new
        {
            last.moves += 1;
            return (last.to, super::joined_outcome(val, last.to, last.joined));
        }
        self.settle(w);
        if let Some((to, joined)) = w.cached(JOIN, val, new) {
            w.last_join(val, new, to, joined);
            return (to, super::joined_outcome(val, to, joined));
        }
        let mut items = std::mem::take(&mut w.scratch);
        items.clear();
        if is_inline(val) {
            items.push(val);
        } else {
            items.extend_from_slice(self.lists().entries(val));
        }
        let (to, joined) = match find(&items, id) {
            Some(pos) if items[pos] | new == items[pos] => (Some(val), false),
            Some(pos) => {
                items[pos] |= new;
                (self.intern(w, &items), false)
            }
            None => {
                let pos = items.partition_point(|&e| entry_id(e) < id);
                items.insert(pos, new);
                (self.intern(w, &items), true)
            }
        };
        w.scratch = items;
        let Some(to) = to else {
            return (val, super::KEPT);
        };
        w.remember(JOIN, val, new, to, joined);
        w.last_join(val, new, to, joined);
        (to, super::joined_outcome(val, to, joined))
    }

    /// Apply the reference moves of the pending joins (see [`LastJoin`]). Every path that
    /// changes references calls it first, and the writer slot when it lets the writer go.
    pub(super) fn settle(&self, w: &mut SetWriter) {
        if let Some(last) = w.last.take() {
            self.switch_n(w, last.from, last.to, last.moves);
        }
    }

    /// Set value `val` with tier `bits` of holder `id` cleared (never empty: a set has two
    /// entries or more, and the last one left becomes an inline value).
    pub(super) fn leave(&self, w: &mut SetWriter, val: u32, id: u32, bits: u8) -> (u32, Removed) {
        debug_assert!(!is_inline(val), "inline values leave in `super`");
        self.settle(w);
        let op = super::make_entry(id, bits);
        let gone = |went: bool| {
            if went {
                super::GONE_HOLDER
            } else {
                Removed::default()
            }
        };
        if let Some((to, went)) = w.cached(LEAVE, val, op) {
            self.switch(w, val, to);
            return (to, gone(went));
        }
        let mut items = std::mem::take(&mut w.scratch);
        items.clear();
        items.extend_from_slice(self.lists().entries(val));
        let (to, went) = match find(&items, id) {
            None => (Some(val), false),
            Some(pos) => {
                let left = entry_bits(items[pos]) & !bits & ALL_TIERS;
                if left == entry_bits(items[pos]) {
                    (Some(val), false)
                } else if left != 0 {
                    items[pos] = super::make_entry(id, left);
                    (self.intern(w, &items), false)
                } else {
                    items.remove(pos);
                    // Sets have two or more entries, so one is left at least.
                    if items.len() == 1 {
                        (Some(items[0]), true)
                    } else {
                        (self.intern(w, &items), true)
                    }
                }
            }
        };
        w.scratch = items;
        // A refused intern (limits) keeps the block as it was: stay consistent.
        let Some(to) = to else {
            return (val, Removed::default());
        };
        w.remember(LEAVE, val, op, to, went);
        self.switch(w, val, to);
        (to, gone(went))
    }

    /// The value for a new block with entries `items` (sorted by holder, two or more), its
    /// reference counted: for a table filled in bulk, where a block's holders are all known at
    /// once and joining them one by one would intern every intermediate set. `None` at the set
    /// or arena limit.
    pub(super) fn adopt(&self, w: &mut SetWriter, items: &[u32]) -> Option<u32> {
        self.settle(w);
        let to = self.intern(w, items)?;
        if let Some(r) = w.refs.get_mut(set_id(to) as usize) {
            *r += 1;
        }
        Some(to)
    }

    /// A block's value changes from `from` to `to`: move its reference (the new one first, so
    /// that `from` is freed only when no block names it).
    fn switch(&self, w: &mut SetWriter, from: u32, to: u32) {
        self.switch_n(w, from, to, 1);
    }

    /// [`Self::switch`] for `n` blocks.
    fn switch_n(&self, w: &mut SetWriter, from: u32, to: u32, n: u32) {
        if from == to {
            return;
        }
        if !is_inline(to)
            && let Some(r) = w.refs.get_mut(set_id(to) as usize)
        {
            *r += n;
        }
        if !is_inline(from) {
            self.release(w, set_id(from), n);
        }
    }

    /// The set value with entries `items` (sorted, two or more); a new set starts without
    /// references and gets its first from [`Self::switch`] right after. `None` at the set or
    /// arena limit.
    fn intern(&self, w: &mut SetWriter, items: &[u32]) -> Option<u32> {
        let h = w.hash(items);
        {
            let lists = self.lists();
            let found = w
                .index
                .find(h, &w.hashes, |id| lists.entries(set_value(id)) == items);
            if let Some(id) = found {
                return Some(set_value(id));
            }
        }
        let mut lists = Innermost::new(write_lock(&self.lists));
        let off = lists.arena.alloc(items)?;
        let id = match w.free.pop() {
            Some(id) => {
                // Before any block names the id again (see the module doc).
                self.reused.fetch_add(1, Ordering::Release);
                lists.offs[id as usize] = off;
                id
            }
            None => {
                let id = w.refs.len() as u32;
                if id >= MAX_SETS {
                    lists.arena.release(off);
                    return None;
                }
                w.refs.push(0);
                w.gens.push(0);
                w.hashes.push(0);
                lists.offs.push(off);
                id
            }
        };
        drop(lists);
        w.gens[id as usize] = w.gens[id as usize].wrapping_add(1);
        w.hashes[id as usize] = h;
        w.index.insert(id, &w.hashes);
        Some(set_value(id))
    }

    /// Drop `n` references of set `id`, freeing it when none is left.
    fn release(&self, w: &mut SetWriter, id: u32, n: u32) {
        let Some(refs) = w.refs.get_mut(id as usize) else {
            return;
        };
        *refs = refs.saturating_sub(n);
        if *refs > 0 {
            return;
        }
        w.index.remove(id, &w.hashes);
        let mut lists = Innermost::new(write_lock(&self.lists));
        let off = lists.offs[id as usize];
        lists.arena.release(off);
        drop(lists);
        w.free.push(id);
    }

    /// No lock of the sets is held (tests).
    #[cfg(test)]
    pub(super) fn unlocked(&self) -> bool {
        self.lists.try_write().is_ok() && self.writer.try_lock().is_ok()
    }

    /// Live sets (tests).
    #[cfg(test)]
    pub(super) fn live(&self) -> usize {
        let w = self.writer();
        w.refs.iter().filter(|&&r| r > 0).count()
    }

    /// References of the set behind `val` (tests).
    #[cfg(test)]
    pub(super) fn refs(&self, val: u32) -> u32 {
        self.writer()
            .refs
            .get(set_id(val) as usize)
            .copied()
            .unwrap_or(0)
    }

    /// Ids ever handed out (tests: freed ids are reused before new ones).
    #[cfg(test)]
    pub(super) fn ids(&self) -> usize {
        self.writer().refs.len()
    }
}

/// Position of holder `id` in sorted `list`.
#[inline]
fn find(list: &[u32], id: u32) -> Option<usize> {
    let pos = list.partition_point(|&e| entry_id(e) < id);
    (list.get(pos).is_some_and(|&e| entry_id(e) == id)).then_some(pos)
}

impl SetWriter {
    fn hash(&self, items: &[u32]) -> u32 {
        let h = items
            .iter()
            .fold(self.seed, |h, &e| mix64(h ^ u64::from(e)));
        (h >> 32) as u32
    }

    fn gen_of(&self, val: u32) -> u32 {
        if is_inline(val) {
            0
        } else {
            self.gens.get(set_id(val) as usize).copied().unwrap_or(0)
        }
    }

    fn slot(kind: u8, from: u32, op: u32) -> usize {
        let h = mix64((u64::from(from) | (u64::from(op) << 32)) ^ (u64::from(kind) << 62));
        (h >> 56) as usize % CACHE_SLOTS
    }

    /// A remembered transition that is still exact: same ids, same generations, target alive.
    fn cached(&self, kind: u8, from: u32, op: u32) -> Option<(u32, bool)> {
        let t = self.cache.get(Self::slot(kind, from, op))?;
        if t.kind != kind || t.from != from || t.op != op || t.from_gen != self.gen_of(from) {
            return None;
        }
        let to_live = is_inline(t.to)
            || t.to == from
            || (self.gen_of(t.to) == t.to_gen
                && self.refs.get(set_id(t.to) as usize).is_some_and(|&r| r > 0));
        to_live.then_some((t.to, t.holder_changed))
    }

    fn last_join(&mut self, from: u32, op: u32, to: u32, joined: bool) {
        self.last = Some(LastJoin {
            from,
            op,
            to,
            joined,
            moves: 1,
        });
    }

    fn remember(&mut self, kind: u8, from: u32, op: u32, to: u32, holder_changed: bool) {
        if self.cache.is_empty() {
            self.cache = vec![Transition::default(); CACHE_SLOTS];
        }
        let t = Transition {
            from,
            op,
            from_gen: self.gen_of(from),
            to_gen: self.gen_of(to),
            to,
            kind,
            holder_changed,
        };
        self.cache[Self::slot(kind, from, op)] = t;
    }
}
