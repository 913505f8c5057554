//! Checkpoint and recovery against the in-memory store: round trips, incremental cost, stale
//! sources, and fault injection before, during and after the atomic write.

use crate::events::{Holder, IndexBatch, IndexOp};
use crate::hashing::HashProfile;
use crate::index::{ContextIndex, ContextSnapshot, Watermark};
use crate::model::{BlockHash, ContextKey, PublisherConfig, SubscriptionKey, Tier};

use super::checkpoint::{context_ops, forget_context_ops, put_registration};
use super::codec;
use super::recovery::recover;
use crate::storage::memory::{Fault, MemoryStore};
use crate::storage::{Cf, KvOp, KvStore};
use crate::test_rng::Rng;

fn profile() -> HashProfile {
    crate::hashing::profile::vllm_cbor_default()
}

fn key() -> ContextKey {
    ContextKey::new("", "m", "", 16)
}

fn source(i: u32) -> SubscriptionKey {
    SubscriptionKey::new(&format!("e{i}"), "", 0)
}

fn registration(i: u32) -> PublisherConfig {
    PublisherConfig::test_vllm(&format!("e{i}"), &format!("tcp://127.0.0.1:{}", 6000 + i))
}

/// One random publisher batch of source `s` (engine or store holder).
fn random_batch(rng: &mut Rng, s: u32) -> IndexBatch {
    let mut ops = Vec::new();
    for _ in 0..1 + rng.below(4) {
        let hashes: Vec<BlockHash> = (0..1 + rng.below(6))
            .map(|_| BlockHash(rng.below(64) as u64))
            .collect();
        let (holder, tier) = if rng.below(4) == 0 {
            (
                Holder::Shared {
                    backend_id: "b".into(),
                },
                if rng.below(2) == 0 {
                    Tier::CpuShare
                } else {
                    Tier::Disk
                },
            )
        } else {
            let tier = [Tier::Device, Tier::CpuLocal, Tier::Disk][rng.below(3)];
            (
                // A hybrid model's KV-cache groups are holders of their own.
                Holder::Engine {
                    instance_id: format!("e{s}"),
                    dp_rank: 0,
                    group: [0, 0, 1, 2][rng.below(4)] as u32,
                },
                tier,
            )
        };
        ops.push(match rng.below(12) {
            0 => IndexOp::ClearHolder { holder },
            10 | 11 if matches!(holder, Holder::Engine { .. }) => IndexOp::GroupKind {
                holder,
                kind: [
                    crate::model::GroupKind::Full,
                    crate::model::GroupKind::Mamba,
                    crate::model::GroupKind::SlidingWindow { window: 20 },
                ][rng.below(3)],
            },
            1..=3 => IndexOp::Remove {
                holder,
                tier,
                hashes,
            },
            _ => IndexOp::Store {
                holder,
                tier,
                hashes,
            },
        });
    }
    IndexBatch {
        source: source(s),
        ops,
    }
}

/// A round over one context, as the checkpointer writes it: the context's changes and, in the
/// same write, the source record of every registered source at the context's position.
fn checkpoint(
    index: &mut ContextIndex,
    store: &dyn KvStore,
) -> Result<(), crate::storage::StorageError> {
    let changes = index.take_changes();
    let mut ops = context_ops(&changes);
    ops.extend(source_ops(index, store));
    let result = store.write(ops);
    if result.is_err() {
        index.mark_dirty(
            changes.pairs.iter().map(|p| (p.holder, p.block)),
            changes.aliases.iter().map(|&(h, _)| h),
            changes.fresh,
        );
    }
    result
}

fn source_ops(index: &ContextIndex, store: &dyn KvStore) -> Vec<KvOp> {
    (0..3)
        .filter_map(|s| {
            let key = source(s).to_string().into_bytes();
            let registration = store.get(Cf::Registrations, &key).unwrap()?;
            let incarnation = codec::decode_incarnation(&registration).unwrap();
            Some(match index.watermark(&source(s)) {
                Some(mark) => KvOp::Put {
                    cf: Cf::Sources,
                    key,
                    value: codec::source_value(incarnation, mark),
                },
                None => KvOp::Delete {
                    cf: Cf::Sources,
                    key,
                },
            })
        })
        .collect()
}

fn recovered_context(store: &MemoryStore) -> Option<ContextIndex> {
    recover(store).unwrap().contexts.into_iter().next()
}

/// Everything recovery must reproduce: the content, the positions, and what queries see (the
/// ranks' KV-cache groups and an answer over every block, hybrid ranks' included).
type State = (
    ContextSnapshot,
    Vec<Option<Watermark>>,
    Vec<crate::index::RankStatus>,
    String,
);

fn state(index: &ContextIndex) -> State {
    let reader = index.reader();
    let prompt: Vec<u64> = (0..64).collect();
    (
        ContextSnapshot::of(index),
        (0..3).map(|s| index.watermark(&source(s))).collect(),
        reader.rank_statuses(None),
        // The plan's id in the answer's shape differs between processes; the hits do not.
        format!("{:?}", reader.query_hashes(&prompt, None).hits),
    )
}

/// 400 random batches of three sources (and some of them dropped) into a new context, with
/// `round(index, step)` after every 25th.
fn random_rounds(rng: &mut Rng, mut round: impl FnMut(&mut ContextIndex, usize)) {
    let mut index = ContextIndex::new(key(), profile());
    index.attach_rank(&source(0), "e0", 0);
    let mut seqs = [0u64; 3];
    for step in 0..400 {
        let s = rng.below(3) as u32;
        seqs[s as usize] += 1;
        let mark = Watermark {
            seq: seqs[s as usize],
            digest: rng.next(),
        };
        index.apply_sequenced(&random_batch(rng, s), mark);
        if rng.below(5) == 0 {
            index.drop_source(&source(rng.below(3) as u32));
        }
        if step % 25 == 24 {
            round(&mut index, step);
        }
    }
}

#[test]
fn recovery_reproduces_every_checkpoint_exactly() {
    for seed in [1, 2, 3] {
        let mut rng = Rng(seed);
        let store = MemoryStore::new();
        for s in 0..3 {
            put_registration(&store, &registration(s)).unwrap();
        }
        random_rounds(&mut rng, |index, step| {
            checkpoint(index, &store).unwrap();
            let recovered = recovered_context(&store).expect("context");
            assert_eq!(state(&recovered), state(index), "seed {seed} step {step}");
        });
    }
}

/// The same through RocksDB, whose packed pairs and aliases are folded from merge operands on
/// read, after a reopen and after a compaction.
#[cfg(feature = "rocksdb")]
#[test]
fn recovery_from_rocksdb_reproduces_every_checkpoint_exactly() {
    use crate::storage::rocks::RocksStore;
    let dir = tempfile::tempdir().unwrap();
    let mut store = Some(RocksStore::open(dir.path()).unwrap());
    if let Some(store) = &store {
        crate::storage::migrations::migrate(store, "test").unwrap();
        for s in 0..3 {
            put_registration(store, &registration(s)).unwrap();
        }
    }
    let mut rng = Rng(4);
    random_rounds(&mut rng, |index, step| {
        if let Some(open) = &store {
            checkpoint(index, open).unwrap();
            match step % 100 {
                49 => {
                    // Closed first: RocksDB's lock allows one opener.
                    drop(store.take());
                    store = Some(RocksStore::open(dir.path()).unwrap());
                }
                99 => open.compact().unwrap(),
                _ => {}
            }
        }
        let open = store.as_ref().expect("reopened");
        let recovered = recover(open).unwrap().contexts.into_iter().next();
        assert_eq!(
            state(&recovered.expect("context")),
            state(index),
            "step {step}"
        );
    });
}

#[test]
fn a_checkpoint_writes_only_what_changed() {
    let store = MemoryStore::new();
    put_registration(&store, &registration(0)).unwrap();
    let mut index = ContextIndex::new(key(), profile());
    let holder = Holder::Engine {
        instance_id: "e0".into(),
        dp_rank: 0,
        group: 0,
    };
    let store_op = |range: std::ops::Range<u64>| IndexBatch {
        source: source(0),
        ops: vec![IndexOp::Store {
            holder: holder.clone(),
            tier: Tier::Device,
            hashes: range.map(BlockHash).collect(),
        }],
    };
    index.apply_sequenced(&store_op(0..10_000), Watermark { seq: 1, digest: 1 });
    assert_eq!(index.take_changes().pairs.len(), 10_000);
    index.apply_sequenced(&store_op(20_000..21_000), Watermark { seq: 2, digest: 2 });
    let changes = index.take_changes();
    assert_eq!(
        changes.pairs.len(),
        1_000,
        "cost follows the change, not the index size"
    );
    assert!(context_ops(&changes).len() < 1_020);
    assert!(!index.has_changes());
}

#[test]
fn sources_without_a_registration_are_not_recovered() {
    let store = MemoryStore::new();
    put_registration(&store, &registration(0)).unwrap();
    let mut index = ContextIndex::new(key(), profile());
    let mut rng = Rng(9);
    for s in [0, 1] {
        for i in 0..20 {
            index.apply_sequenced(
                &random_batch(&mut rng, s),
                Watermark {
                    seq: i + 1,
                    digest: 0,
                },
            );
        }
    }
    checkpoint(&mut index, &store).unwrap();
    // Source 1 was unregistered but the crash came before the next checkpoint.
    let recovered = recovered_context(&store).expect("context");
    let snapshot = ContextSnapshot::of(&recovered);
    assert!(
        snapshot.batches.iter().all(|b| b.source == source(0)),
        "no block of e1 survives"
    );
    assert!(snapshot.attachments.iter().all(|a| a.source == source(0)));
    let regs = recover(&store).unwrap().registrations;
    assert_eq!(regs.len(), 1);
    assert_eq!(
        regs[0].restored.resume.map(|w| w.seq),
        Some(20),
        "resume after the last applied batch"
    );
}

#[test]
fn a_forgotten_context_leaves_nothing_behind() {
    let store = MemoryStore::new();
    let mut index = ContextIndex::new(key(), profile());
    index.apply_sequenced(
        &random_batch(&mut Rng(4), 0),
        Watermark { seq: 1, digest: 0 },
    );
    checkpoint(&mut index, &store).unwrap();
    assert!(store.len(Cf::Contexts) == 1 && store.len(Cf::Holders) > 0);
    store.write(forget_context_ops(&key())).unwrap();
    for cf in [
        Cf::Contexts,
        Cf::Holders,
        Cf::Attachments,
        Cf::Watermarks,
        Cf::Pairs,
    ] {
        assert_eq!(store.len(cf), 0, "{}", cf.name());
    }
}

/// Whatever fails around a checkpoint write, recovery yields the state and watermarks of one
/// checkpoint that fully landed, never a mix.
#[test]
fn recovery_is_consistent_whatever_fails_around_the_write() {
    for fault in [Fault::Before, Fault::During, Fault::After] {
        let mut rng = Rng(77);
        let store = MemoryStore::new();
        for s in 0..3 {
            put_registration(&store, &registration(s)).unwrap();
        }
        let mut index = ContextIndex::new(key(), profile());
        let mut seq = 0;
        let mut apply = |index: &mut ContextIndex, rng: &mut Rng, n: usize| {
            for _ in 0..n {
                seq += 1;
                index.apply_sequenced(
                    &random_batch(rng, 0),
                    Watermark {
                        seq,
                        digest: seq * 3,
                    },
                );
            }
        };
        apply(&mut index, &mut rng, 30);
        checkpoint(&mut index, &store).unwrap();
        let landed = state(&index);
        apply(&mut index, &mut rng, 30);
        store.inject(fault);
        assert!(
            checkpoint(&mut index, &store).is_err(),
            "{fault:?} reports a failure"
        );
        let after_fault = recovered_context(&store).map(|c| state(&c));
        match fault {
            // Nothing of the failed write is visible: the previous checkpoint is intact.
            Fault::Before | Fault::During => {
                assert_eq!(after_fault.as_ref(), Some(&landed), "{fault:?}")
            }
            // The write landed although an error was reported: the new checkpoint is intact.
            Fault::After => assert_eq!(after_fault.as_ref(), Some(&state(&index)), "{fault:?}"),
        }
        // The process lives on: the next checkpoint writes the pairs again and catches up.
        apply(&mut index, &mut rng, 10);
        checkpoint(&mut index, &store).unwrap();
        assert_eq!(
            recovered_context(&store).map(|c| state(&c)),
            Some(state(&index)),
            "{fault:?} then retry"
        );
    }
}

/// A context its source stopped storing into records the source's position all the same, so a
/// restart resumes from where the source stands, not from that context's last batch.
#[test]
fn a_context_the_source_moved_past_resumes_it_where_it_stands() {
    let store = MemoryStore::new();
    put_registration(&store, &registration(0)).unwrap();
    let mut busy = ContextIndex::new(key(), profile());
    let mut idle = ContextIndex::new(ContextKey::new("", "m", "ad", 16), profile());
    let mut rng = Rng(5);
    let mark = |seq| Watermark { seq, digest: seq };
    idle.apply_sequenced(&random_batch(&mut rng, 0), mark(1));
    for seq in 2..50 {
        busy.apply_sequenced(&random_batch(&mut rng, 0), mark(seq));
    }
    idle.advance(&source(0), mark(49));
    idle.advance(&source(0), mark(3));
    assert_eq!(
        idle.watermark(&source(0)),
        Some(mark(49)),
        "an older mark is ignored"
    );
    checkpoint(&mut busy, &store).unwrap();
    checkpoint(&mut idle, &store).unwrap();
    let regs = recover(&store).unwrap().registrations;
    assert_eq!(regs[0].restored.resume, Some(mark(49)));
    // A context with only a position is still one the source feeds: it keeps being advanced.
    let mut fresh = ContextIndex::new(ContextKey::new("", "m", "other", 16), profile());
    fresh.advance(&source(0), mark(7));
    assert!(fresh.reader().fed_by(&source(0)));
}

/// Holders of a detached source are reclaimed: their records go, recovery keeps their ids free
/// for later holders, and a checkpoint with nothing new writes nothing.
#[test]
fn reclaimed_holders_leave_gaps_that_recovery_keeps_free() {
    let store = MemoryStore::new();
    for s in 0..3 {
        put_registration(&store, &registration(s)).unwrap();
    }
    let mut index = ContextIndex::new(key(), profile());
    let mut rng = Rng(3);
    for s in 0..3 {
        index.attach_rank(&source(s), &format!("e{s}"), 0);
    }
    for i in 0..30 {
        let s = (i % 3) as u32;
        let mark = Watermark {
            seq: i + 1,
            digest: i,
        };
        index.apply_sequenced(&random_batch(&mut rng, s), mark);
    }
    checkpoint(&mut index, &store).unwrap();
    let holders_before = store.len(Cf::Holders);
    index.detach_source(&source(1));
    checkpoint(&mut index, &store).unwrap();
    assert!(
        store.len(Cf::Holders) < holders_before,
        "e1's records are gone"
    );
    assert!(
        context_ops(&index.take_changes()).is_empty(),
        "an idle checkpoint writes nothing"
    );
    let mut recovered = recovered_context(&store).expect("context");
    assert_eq!(state(&recovered), state(&index));
    assert_eq!(recovered.stats(), index.stats());
    assert!(context_ops(&recovered.take_changes()).is_empty());
    // A holder new after the restart takes a free id, like it does in the live index.
    for ix in [&mut index, &mut recovered] {
        ix.attach_rank(&source(1), "e1", 0);
        ix.apply_sequenced(
            &random_batch(&mut Rng(8), 1),
            Watermark { seq: 99, digest: 9 },
        );
    }
    assert_eq!(state(&recovered), state(&index));
    assert_eq!(recovered.stats(), index.stats());
    checkpoint(&mut recovered, &store).unwrap();
    assert_eq!(
        state(&recovered_context(&store).expect("context")),
        state(&index)
    );
}

/// Pairs are read holder by holder, on several threads: a pair record of an id no holder record
/// names is not loaded (as when every pair was read), and a corrupt pair record of a restored
/// holder still fails recovery, naming the column family, whichever thread reads it.
#[test]
fn pairs_of_unknown_holders_are_skipped_and_corrupt_pairs_still_fail() {
    let store = MemoryStore::new();
    for s in 0..3 {
        put_registration(&store, &registration(s)).unwrap();
    }
    let mut index = ContextIndex::new(key(), profile());
    let mut rng = Rng(5);
    for i in 0..30 {
        let mark = Watermark {
            seq: i + 1,
            digest: i,
        };
        index.apply_sequenced(&random_batch(&mut rng, (i % 3) as u32), mark);
    }
    checkpoint(&mut index, &store).unwrap();
    assert!(index.stats().holders >= 3, "several holders to share out");
    let ctx = codec::context_id(&key());
    let put = |holder: u32, block: u64, value: Vec<u8>| KvOp::Put {
        cf: Cf::Pairs,
        key: codec::pair_key(&ctx, holder, block),
        value,
    };
    store
        .write(vec![put(999, 42, codec::pair_value(1, []))])
        .unwrap();
    let back = recover(&store).unwrap();
    assert_eq!(back.pairs, index.stats().holder_blocks);
    assert_eq!(state(&back.contexts[0]), state(&index));
    // A repeat count on a tier the pair does not hold.
    store
        .write(vec![put(0, 43, vec![1, 2, 0, 0, 0, 1])])
        .unwrap();
    match recover(&store) {
        Err(e) => assert!(e.is_corruption() && e.to_string().contains("pairs"), "{e}"),
        Ok(_) => panic!("a corrupt pair record recovered"),
    }
}

/// Tokens of a 40-block prompt, and the chained store an engine publishes for it (blocks keyed
/// by the keys the context derives from the contents, under its own tuning).
fn chained_prompt() -> (Vec<i32>, IndexOp) {
    let bs = key().block_size as usize;
    let tokens: Vec<i32> = (0..40 * bs as i32).map(|t| 7 + t).collect();
    let digests = tokens
        .chunks(bs)
        .map(|b| crate::hashing::derived::content(b.iter().map(|&t| i64::from(t)), bs, 0))
        .collect();
    let op = IndexOp::StoreChained {
        holder: Holder::Engine {
            instance_id: "e0".into(),
            dp_rank: 0,
            group: 0,
        },
        tier: Tier::Device,
        hashes: (0..40).map(|i| BlockHash(0xabc0_0000 + i)).collect(),
        contents: crate::events::BlockContents {
            parent: None,
            root: crate::hashing::derived::root(""),
            digests,
        },
    };
    (tokens, op)
}

/// A context of `tuning` holding the chained prompt on `e0`'s device, and the prompt's tokens.
fn context_with_prompt(tuning: crate::hashing::derived::ChainTuning) -> (ContextIndex, Vec<i32>) {
    let mut index = ContextIndex::tuned(key(), profile(), tuning);
    index.attach_rank(&source(0), "e0", 0);
    let (tokens, op) = chained_prompt();
    let batch = IndexBatch {
        source: source(0),
        ops: vec![op],
    };
    index.apply_sequenced(&batch, Watermark { seq: 1, digest: 9 });
    (index, tokens)
}

fn device_blocks(index: &ContextIndex, tokens: &[i32]) -> u64 {
    let hits = index.reader().query_tokens(tokens, "", None);
    hits.hits.get("e0").map_or(0, |h| h.rank_matches[&0].device) / key().block_size as u64
}

/// A store records the chain tuning its keys were made with, and recovery rebuilds every context
/// with it: a store written under one tuning restarts exactly under a binary whose default is
/// another. Read as the default instead, the same records would answer only a stub.
#[test]
fn a_store_written_under_one_chain_tuning_restarts_exactly_under_another() {
    use crate::hashing::derived::ChainTuning;
    use crate::storage::migrations;
    let tuned = ChainTuning::new(3, 2).expect("tuning");
    assert_ne!(tuned, ChainTuning::DEFAULT);
    let store = MemoryStore::new();
    migrations::migrate(&store, "mem").unwrap();
    assert_eq!(
        migrations::read_tuning(&store).unwrap(),
        ChainTuning::DEFAULT,
        "a new store"
    );
    // As a store created under `tuned` (another binary's default).
    store.write(vec![migrations::tuning_op(tuned)]).unwrap();
    put_registration(&store, &registration(0)).unwrap();

    let (mut index, tokens) = context_with_prompt(tuned);
    assert_eq!(device_blocks(&index, &tokens), 40);
    checkpoint(&mut index, &store).unwrap();

    let recovered = recover(&store).unwrap();
    assert_eq!(recovered.tuning, tuned);
    let back = recovered.contexts.into_iter().next().expect("context");
    assert_eq!(
        device_blocks(&back, &tokens),
        40,
        "every block, from tokens"
    );
    assert_eq!(state(&back), state(&index));

    // Without the record the keys would be read as the default's: a short prefix at most.
    store
        .write(vec![migrations::tuning_op(ChainTuning::DEFAULT)])
        .unwrap();
    let misread = recover(&store)
        .unwrap()
        .contexts
        .into_iter()
        .next()
        .expect("context");
    assert!(device_blocks(&misread, &tokens) < 40);
}

/// Migration 8 records the tuning every older store was made with and changes no key.
#[test]
fn migration_8_records_the_tuning_older_stores_were_made_with() {
    use crate::hashing::derived::ChainTuning;
    use crate::storage::migrations;
    let store = MemoryStore::new();
    put_registration(&store, &registration(0)).unwrap();
    store.write(vec![migrations::version_op(7)]).unwrap();
    let (mut index, tokens) = context_with_prompt(ChainTuning::UNRECORDED);
    checkpoint(&mut index, &store).unwrap();
    assert_eq!(migrations::migrate(&store, "mem").unwrap(), 7);
    assert_eq!(
        migrations::read_tuning(&store).unwrap(),
        ChainTuning::UNRECORDED
    );
    let back = recover(&store)
        .unwrap()
        .contexts
        .into_iter()
        .next()
        .expect("context");
    assert_eq!(device_blocks(&back, &tokens), 40);
}
