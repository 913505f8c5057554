//! Migration 5 on a schema 4 store (memory and RocksDB), and 6 on a schema 5 store (the same
//! step: schema 5 kept schema 4's layout): what it drops, keeps and resets, that a
//! run killed after any of its writes is finished by the next start, and what a restart of the
//! migrated store answers.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::drop_derived::{self, REBUILD_POSITION};
use super::memory::MemoryStore;
use super::migrations;
use super::{Cf, KvOp, KvStore, Scanned, StorageError, Visitor};
use crate::durability::codec;
use crate::events::{Holder, IndexOp};
use crate::index::{ContextSnapshot, HolderRecord, Watermark};
use crate::model::{ContextKey, PublisherConfig, SubscriptionKey, Tier};

// Tier bits of a pair value.
const DEVICE: u8 = 1;
const CPU_LOCAL: u8 = 2;
const CPU_SHARE: u8 = 4;
const DISK: u8 = 8;

fn ctx_a() -> ContextKey {
    ContextKey::new("default", "m", "", 16)
}

fn ctx_b() -> ContextKey {
    ContextKey::new("default", "m", "adapter", 16)
}

fn source(i: u32) -> SubscriptionKey {
    SubscriptionKey::new(&format!("e{i}"), "default", 0)
}

fn engine(i: u32) -> Holder {
    Holder::Engine {
        instance_id: format!("e{i}"),
        dp_rank: 0,
        group: 0,
    }
}

fn shared(name: &str) -> Holder {
    Holder::Shared {
        backend_id: name.into(),
    }
}

fn mark(seq: u64) -> Watermark {
    Watermark {
        seq,
        digest: seq * 10,
    }
}

fn put(cf: Cf, key: Vec<u8>, value: Vec<u8>) -> KvOp {
    KvOp::Put { cf, key, value }
}

/// A pair as schema 4 wrote it: block, tier bits, (tier bit, announcements beyond the first).
type Pair = (u64, u8, Vec<(u8, u32)>);

/// A holder record: id, source number, holder, `raw_pairs`, its pairs.
type HolderRows = (u32, u32, Holder, Option<u64>, Vec<Pair>);

/// A context's header, holders, listings (source numbers), watermarks (source, seq) and aliases,
/// as schema 4 wrote them.
struct Context<'a> {
    key: ContextKey,
    holders: Vec<HolderRows>,
    attached: &'a [u32],
    marks: &'a [(u32, u64)],
    aliases: &'a [(u64, u64)],
}

fn write_context(store: &dyn KvStore, c: Context<'_>) {
    let ctx = codec::context_id(&c.key);
    let profile = crate::hashing::profile::vllm_cbor_default();
    let mut ops = vec![put(
        Cf::Contexts,
        ctx.to_vec(),
        codec::context_value(&c.key, &profile),
    )];
    for (id, s, holder, raw_pairs, pairs) in c.holders {
        let record = HolderRecord {
            id,
            source: source(s),
            holder,
            raw_pairs,
            kind: crate::model::GroupKind::Full,
        };
        ops.push(put(
            Cf::Holders,
            codec::indexed_key(&ctx, id),
            codec::holder_value(&record),
        ));
        for (block, bits, repeats) in pairs {
            ops.push(put(
                Cf::Pairs,
                codec::pair_key(&ctx, id, block),
                codec::pair_value(bits, repeats),
            ));
        }
    }
    for (n, &s) in c.attached.iter().enumerate() {
        let value = codec::attachment_value(&source(s), &format!("e{s}"), 0);
        ops.push(put(
            Cf::Attachments,
            codec::indexed_key(&ctx, n as u32),
            value,
        ));
    }
    for &(s, seq) in c.marks {
        let mut key = ctx.to_vec();
        key.extend_from_slice(source(s).to_string().as_bytes());
        ops.push(put(Cf::Watermarks, key, codec::watermark_value(mark(seq))));
    }
    for &(hash, derived) in c.aliases {
        ops.push(put(
            Cf::Aliases,
            codec::alias_key(&ctx, hash),
            derived.to_be_bytes().to_vec(),
        ));
    }
    store.write(ops).unwrap();
}

/// Context A: source e0's engine holder mixes published hashes (even) with derived keys (odd,
/// one with a repeat count), its store holder has only a derived key; source e1's engine holder
/// counts all its pairs as published (one of them odd), its store holder is a schema 1 record
/// (an odd published hash). Context B: source e2 mixes, and e0 has a position but no holder.
fn schema_4_store(store: &dyn KvStore) {
    store_of_schema(store, 4);
}

/// [`schema_4_store`]'s records, stamped with schema `version` (4 or 5: the same layout).
fn store_of_schema(store: &dyn KvStore, version: u32) {
    for s in 0..3 {
        // The registration layout before schema 7: no incarnation.
        let config = PublisherConfig::test_vllm(&format!("e{s}"), "tcp://127.0.0.1:1");
        let value = codec::registration_value(&config);
        let key = config.subscription_key().to_string().into_bytes();
        store
            .write(vec![KvOp::Put {
                cf: Cf::Registrations,
                key,
                value,
            }])
            .unwrap();
    }
    write_context(
        store,
        Context {
            key: ctx_a(),
            holders: vec![
                (
                    0,
                    0,
                    engine(0),
                    Some(2),
                    vec![
                        (0x10, DEVICE, vec![(DEVICE, 2)]),
                        (0x20, CPU_LOCAL, vec![]),
                        (0x31, DEVICE, vec![(DEVICE, 1)]),
                        (0x41, DEVICE | CPU_LOCAL, vec![]),
                    ],
                ),
                (
                    1,
                    0,
                    shared("store"),
                    Some(0),
                    vec![(0x51, CPU_SHARE, vec![])],
                ),
                (
                    2,
                    1,
                    engine(1),
                    Some(2),
                    vec![(0x60, DEVICE, vec![]), (0x71, DEVICE, vec![])],
                ),
                (3, 1, shared("s1"), None, vec![(0x81, DISK, vec![])]),
            ],
            attached: &[0, 1],
            marks: &[(0, 10), (1, 20)],
            aliases: &[(0x1000, 0x31), (0x1001, 0x41), (0x1002, 0x51)],
        },
    );
    write_context(
        store,
        Context {
            key: ctx_b(),
            holders: vec![(
                0,
                2,
                engine(2),
                Some(1),
                vec![(0x90, DEVICE, vec![]), (0xa1, DEVICE, vec![])],
            )],
            attached: &[2],
            marks: &[(0, 11), (2, 30)],
            aliases: &[(0x2000, 0xa1)],
        },
    );
    store.write(vec![migrations::version_op(version)]).unwrap();
}

type Dump = Vec<(Cf, Vec<u8>, Vec<u8>)>;

fn dump(store: &dyn KvStore) -> Dump {
    let mut out = Vec::new();
    for cf in Cf::ALL {
        store
            .scan_prefix(cf, b"", &mut |k, v| {
                out.push((cf, k.to_vec(), v.to_vec()));
                Ok(())
            })
            .unwrap();
    }
    out
}

fn records(store: &dyn KvStore, cf: Cf) -> Vec<(Vec<u8>, Vec<u8>)> {
    dump(store)
        .into_iter()
        .filter(|(c, _, _)| *c == cf)
        .map(|(_, k, v)| (k, v))
        .collect()
}

/// What a migrated store holds, checked record by record.
fn check_migrated(store: &dyn KvStore) {
    let (a, b) = (codec::context_id(&ctx_a()), codec::context_id(&ctx_b()));
    assert_eq!(
        migrations::read_version(store).unwrap(),
        Some(migrations::CURRENT_VERSION)
    );
    let pair = |ctx: &[u8; 8], id, block, bits, repeats: Vec<(u8, u32)>| {
        (
            codec::pair_key(ctx, id, block),
            codec::pair_value(bits, repeats),
        )
    };
    let mut expected = vec![
        pair(&a, 0, 0x10, DEVICE, vec![(DEVICE, 2)]),
        pair(&a, 0, 0x20, CPU_LOCAL, vec![]),
        pair(&a, 2, 0x60, DEVICE, vec![]),
        pair(&a, 2, 0x71, DEVICE, vec![]),
        pair(&a, 3, 0x81, DISK, vec![]),
        pair(&b, 0, 0x90, DEVICE, vec![]),
    ];
    expected.sort();
    assert_eq!(records(store, Cf::Pairs), expected, "published hashes kept");
    assert!(
        records(store, Cf::Aliases).is_empty(),
        "every alias dropped"
    );
    let raw_pairs: Vec<(u32, Option<u64>)> = records(store, Cf::Holders)
        .iter()
        .map(|(k, v)| {
            let id = crate::durability::recovery::holder_id(k);
            (id, codec::decode_holder(id, v).unwrap().raw_pairs)
        })
        .collect();
    // Context A's ids, then B's (the contexts' ids sort A first or B first).
    let mut want = vec![(0, Some(2)), (1, Some(0)), (2, Some(2)), (3, None)];
    if b < a {
        want.insert(0, (0, Some(1)));
    } else {
        want.push((0, Some(1)));
    }
    assert_eq!(raw_pairs, want, "raw_pairs count what each holder keeps");
    let rebuild = REBUILD_POSITION.to_vec();
    let position = |ctx: &[u8; 8], s: u32| {
        let mut key = ctx.to_vec();
        key.extend_from_slice(source(s).to_string().as_bytes());
        store.get(Cf::Watermarks, &key).unwrap()
    };
    assert_eq!(position(&a, 0), Some(rebuild.clone()), "e0 lost pairs in A");
    assert_eq!(
        position(&b, 0),
        Some(rebuild.clone()),
        "e0's position in B too: it resumes from its lowest"
    );
    assert_eq!(position(&b, 2), Some(rebuild), "e2 lost pairs in B");
    assert_eq!(
        position(&a, 1),
        Some(codec::watermark_value(mark(20))),
        "e1 lost nothing"
    );
    assert_eq!(records(store, Cf::Watermarks).len(), 4);
}

/// A restart of the migrated store: exactly the kept pairs answer, nothing by derived key.
fn check_restart(store: &dyn KvStore) {
    let recovered = crate::durability::recovery::recover(store).unwrap();
    assert_eq!(recovered.pairs, 6);
    let resume: Vec<(String, Option<Watermark>)> = recovered
        .registrations
        .iter()
        .map(|r| (r.config.instance_id.clone(), r.restored.resume))
        .collect();
    let past = Watermark {
        seq: u64::MAX,
        digest: 0,
    };
    assert_eq!(
        resume,
        [
            ("e0".to_owned(), Some(past)),
            ("e1".to_owned(), Some(mark(20))),
            ("e2".to_owned(), Some(past)),
        ]
    );
    let mut contexts = recovered.contexts;
    let at = contexts.iter().position(|c| *c.key() == ctx_a()).unwrap();
    let mut a = contexts.swap_remove(at);
    let snapshot = ContextSnapshot::of(&a);
    assert!(snapshot.aliases.is_empty());
    let mut stored: Vec<(String, Holder, Tier, u64)> = Vec::new();
    for batch in &snapshot.batches {
        for op in &batch.ops {
            if let IndexOp::Store {
                holder,
                tier,
                hashes,
            } = op
            {
                for h in hashes {
                    stored.push((batch.source.to_string(), holder.clone(), *tier, h.0));
                }
            }
        }
    }
    stored.sort_by(|x, y| (&x.0, x.3, x.2.index()).cmp(&(&y.0, y.3, y.2.index())));
    let e0 = source(0).to_string();
    let e1 = source(1).to_string();
    assert_eq!(
        stored,
        [
            // Announced three times: the repeat count stayed with its pair.
            (e0.clone(), engine(0), Tier::Device, 0x10),
            (e0.clone(), engine(0), Tier::Device, 0x10),
            (e0.clone(), engine(0), Tier::Device, 0x10),
            (e0, engine(0), Tier::CpuLocal, 0x20),
            (e1.clone(), engine(1), Tier::Device, 0x60),
            (e1.clone(), engine(1), Tier::Device, 0x71),
            (e1, shared("s1"), Tier::Disk, 0x81),
        ]
    );
    let reader = a.reader();
    assert_eq!(reader.stats().raw_pairs, 5, "every kept pair is raw");
    let hits = reader.query_hashes(&[0x10, 0x20], None);
    assert_eq!(hits.hits.get("e0").map(|h| h.cpu_local), Some(32));
    let derived = reader.query_hashes(&[0x1000, 0x31], None);
    assert_eq!(
        derived.hits.get("e0").map(|h| h.disk),
        Some(0),
        "nothing by a dropped alias or derived key"
    );
    // The store holder left with nothing is reclaimed by the first checkpoint, as any holder
    // that owns nothing and that no source lists.
    assert_eq!(a.take_changes().holders_gone, [1]);
}

#[test]
fn a_schema_4_memory_store_keeps_its_published_hashes_and_rebuilds_the_rest() {
    let store = MemoryStore::new();
    schema_4_store(&store);
    assert_eq!(migrations::migrate(&store, "test").unwrap(), 4);
    check_migrated(&store);
    check_restart(&store);
    let again = dump(&store);
    assert_eq!(
        migrations::migrate(&store, "test").unwrap(),
        migrations::CURRENT_VERSION
    );
    assert_eq!(dump(&store), again, "a migrated store is left as it is");
}

/// Schema 6 changed the derived keys again: a schema 5 store loses its derived keys and aliases
/// as a schema 4 one did, and keeps its published hashes.
#[test]
fn a_schema_5_memory_store_drops_its_derived_keys_and_keeps_its_published_hashes() {
    let store = MemoryStore::new();
    store_of_schema(&store, 5);
    assert_eq!(migrations::migrate(&store, "test").unwrap(), 5);
    check_migrated(&store);
    check_restart(&store);
}

/// A store migrated to schema 5 (its derived keys already dropped) takes step 6 without losing
/// anything more: what 5 kept is all published hashes, counted as such.
#[test]
fn step_6_after_step_5_drops_nothing_more() {
    let store = MemoryStore::new();
    schema_4_store(&store);
    assert_eq!(migrations::migrate_to(&store, "test", 5).unwrap(), 4);
    let after_5 = dump(&store);
    assert_eq!(migrations::migrate_to(&store, "test", 6).unwrap(), 5);
    let after_6 = dump(&store);
    let without_version = |d: &Dump| -> Dump {
        d.iter()
            .filter(|(cf, _, _)| *cf != Cf::Meta)
            .cloned()
            .collect()
    };
    assert_eq!(without_version(&after_6), without_version(&after_5));
    migrations::migrate(&store, "test").unwrap();
    check_migrated(&store);
}

/// Fails every write after the first `writes`, writing nothing: a process killed there.
struct KilledAfter<'a> {
    inner: &'a dyn KvStore,
    writes: AtomicUsize,
}

impl KvStore for KilledAfter<'_> {
    fn write(&self, ops: Vec<KvOp>) -> Result<(), StorageError> {
        let left = self.writes.load(Ordering::Relaxed);
        if left == 0 {
            return Err(StorageError::Io("killed".into()));
        }
        self.writes.store(left - 1, Ordering::Relaxed);
        self.inner.write(ops)
    }
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.inner.get(cf, key)
    }
    fn scan_prefix(&self, cf: Cf, prefix: &[u8], visit: &mut Visitor<'_>) -> Scanned {
        self.inner.scan_prefix(cf, prefix, visit)
    }
    fn compact(&self) -> Result<(), StorageError> {
        self.inner.compact()
    }
}

/// The step in batches of one pair writes 5 times (e0's engine holder twice, its store holder,
/// e2's holder, the aliases): killed after each of them, the next start finishes the job.
#[test]
fn a_memory_store_migration_killed_after_any_write_is_finished_by_the_next_start() {
    for writes in 0..5 {
        let store = MemoryStore::new();
        schema_4_store(&store);
        let killed = KilledAfter {
            inner: &store,
            writes: AtomicUsize::new(writes),
        };
        assert!(
            drop_derived::drop_in_batches(&killed, 1).is_err(),
            "{writes}"
        );
        assert_eq!(migrations::read_version(&store).unwrap(), Some(4));
        assert_eq!(migrations::migrate(&store, "test").unwrap(), 4);
        check_migrated(&store);
    }
    let store = MemoryStore::new();
    schema_4_store(&store);
    let done = drop_derived::drop_in_batches(&store, 1).unwrap();
    assert_eq!(
        (done.pairs, done.holders, done.positions),
        (4, 3, 3),
        "0x31, 0x41, 0x51 and 0xa1; e0's two positions and e2's"
    );
}

#[cfg(feature = "rocksdb")]
#[test]
fn a_schema_4_rocksdb_store_migrates_resumably_and_restarts_with_its_published_hashes() {
    use super::rocks::RocksStore;
    for writes in [0, 1, 3, 4] {
        let dir = tempfile::tempdir().unwrap();
        {
            let rocks = RocksStore::open(dir.path()).unwrap();
            schema_4_store(&rocks);
            let killed = KilledAfter {
                inner: &rocks,
                writes: AtomicUsize::new(writes),
            };
            assert!(
                drop_derived::drop_in_batches(&killed, 1).is_err(),
                "{writes}"
            );
        }
        let rocks = RocksStore::open(dir.path()).unwrap();
        assert_eq!(migrations::migrate(&rocks, "test").unwrap(), 4);
        check_migrated(&rocks);
    }
    let dir = tempfile::tempdir().unwrap();
    {
        let rocks = RocksStore::open(dir.path()).unwrap();
        schema_4_store(&rocks);
        assert_eq!(migrations::migrate(&rocks, "test").unwrap(), 4);
        check_migrated(&rocks);
        // The compaction at the end folded the removals: no bucket is left empty or holds a
        // removed entry, and none of a context's aliases is stored.
        assert!(rocks.stored_keys(Cf::Aliases).is_empty());
        let buckets = rocks.stored_keys(Cf::Pairs);
        let mut kept: Vec<Vec<u8>> = records(&rocks, Cf::Pairs)
            .into_iter()
            .map(|(k, _)| k[..14].to_vec())
            .collect();
        kept.dedup();
        assert_eq!(buckets, kept, "a bucket only where a pair is kept");
    }
    let rocks = RocksStore::open(dir.path()).unwrap();
    check_migrated(&rocks);
    check_restart(&rocks);
}
