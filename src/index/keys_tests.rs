//! Unit tests of repeated announcements and of derived keys: blocks published under a recipe the
//! registered profile cannot reproduce are still found from tokens, by hash through aliases, and
//! removed through their published hashes.

use crate::events::{BlockContents, Holder, IndexBatch, IndexOp};
use crate::hashing::{HashProfile, derived};
use crate::model::{BlockHash, ContextKey, SubscriptionKey, Tier};

use super::table::{DEVICE, tier_bit};
use super::*;

const BS: u32 = 4;

fn vllm_profile() -> HashProfile {
    crate::hashing::profile::vllm_cbor_default()
}

fn index() -> ContextIndex {
    ContextIndex::new(ContextKey::new("", "m", "", BS), vllm_profile())
}

fn source() -> SubscriptionKey {
    SubscriptionKey::new("i", "", 0)
}

fn engine() -> Holder {
    Holder::Engine {
        instance_id: "i".into(),
        dp_rank: 0,
        group: 0,
    }
}

fn batch(ops: Vec<IndexOp>) -> IndexBatch {
    IndexBatch {
        source: source(),
        ops,
    }
}

fn prompt(n_blocks: usize) -> Vec<i32> {
    (0..n_blocks as i32 * BS as i32).map(|t| 100 + t).collect()
}

/// Hashes no registered profile reproduces, as an engine with an unnameable recipe publishes.
fn engine_hashes(range: std::ops::Range<u64>) -> Vec<BlockHash> {
    range.map(|i| BlockHash(0xeeee_0000 + i)).collect()
}

/// A chained store of blocks `from..to` of `tokens`, the way an engine event publishes them.
fn chained(tokens: &[i32], from: usize, to: usize, salt: &str, tier: Tier) -> IndexOp {
    let bs = BS as usize;
    let digests = (from..to)
        .map(|b| {
            let block = tokens[b * bs..(b + 1) * bs].iter().map(|&t| i64::from(t));
            derived::content(block, bs, 0)
        })
        .collect();
    IndexOp::StoreChained {
        holder: engine(),
        tier,
        hashes: engine_hashes(from as u64..to as u64),
        contents: BlockContents {
            parent: (from > 0).then(|| BlockHash(0xeeee_0000 + from as u64 - 1)),
            root: derived::root(salt),
            digests,
        },
    }
}

fn device(ix: &ContextIndex, tokens: &[i32], salt: &str) -> u64 {
    let hits = ix.reader().query_tokens(tokens, salt, None);
    hits.hits["i"].rank_matches[&0].device
}

#[test]
fn blocks_are_found_from_tokens_whatever_the_engine_hashes() {
    let mut ix = index();
    let tokens = prompt(4);
    let report = ix.apply(&batch(vec![chained(&tokens, 0, 2, "", Tier::Device)]));
    assert_eq!((report.translated, report.unlinked), (2, 0));
    // The next event continues from the engine's hash of block 1.
    ix.apply(&batch(vec![chained(&tokens, 2, 4, "", Tier::Device)]));
    assert_eq!(device(&ix, &tokens, ""), 16);
    assert_eq!(device(&ix, &tokens[..10], ""), 8, "two complete blocks");
    let mut other = tokens.clone();
    other[5] += 1;
    assert_eq!(
        device(&ix, &other, ""),
        4,
        "a different block 1 ends the prefix"
    );
    // By hash: the engine's hashes name the blocks through their aliases.
    let hashes: Vec<u64> = engine_hashes(0..4).iter().map(|h| h.0).collect();
    let by_hash = ix.reader().query_hashes(&hashes, None);
    assert_eq!(by_hash.hits["i"].device, 16);
    assert_eq!(
        ix.shared
            .raw_pairs
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[test]
fn a_removal_by_published_hash_reaches_the_derived_block() {
    let mut ix = index();
    let tokens = prompt(3);
    ix.apply(&batch(vec![chained(&tokens, 0, 3, "", Tier::Device)]));
    ix.apply(&batch(vec![IndexOp::Remove {
        holder: engine(),
        tier: Tier::Device,
        hashes: engine_hashes(1..2),
    }]));
    assert_eq!(device(&ix, &tokens, ""), 4);
    assert_eq!(ix.stats().holder_blocks, 2);
}

#[test]
fn a_block_stored_twice_needs_two_removes() {
    let mut ix = index();
    let tokens = prompt(2);
    // Two identical prompts scheduled together: both announce the same blocks.
    let store = chained(&tokens, 0, 2, "", Tier::Device);
    let report = ix.apply(&batch(vec![store.clone(), store]));
    assert_eq!((report.stored, report.repeated), (4, 2));
    let remove = || {
        batch(vec![IndexOp::Remove {
            holder: engine(),
            tier: Tier::Device,
            hashes: engine_hashes(1..2),
        }])
    };
    let report = ix.apply(&remove());
    assert_eq!(report.repeated_removes, 1);
    assert_eq!(device(&ix, &tokens, ""), 8, "the other copy stays");
    let key = ix.shared.aliases.get(0xeeee_0001).unwrap();
    assert_eq!(ix.announcements(0, key, DEVICE), 1);
    ix.apply(&remove());
    assert_eq!(device(&ix, &tokens, ""), 4);
    assert_eq!(ix.announcements(0, key, DEVICE), 0);
    // A third remove of a block no longer held changes nothing.
    ix.apply(&remove());
    assert_eq!(device(&ix, &tokens, ""), 4);
}

#[test]
fn clearing_a_holder_resets_its_counts() {
    let mut ix = index();
    let tokens = prompt(1);
    let store = chained(&tokens, 0, 1, "", Tier::CpuLocal);
    ix.apply(&batch(vec![store.clone(), store.clone(), store]));
    let key = ix.shared.aliases.get(0xeeee_0000).unwrap();
    assert_eq!(ix.announcements(0, key, tier_bit(Tier::CpuLocal)), 3);
    ix.apply(&batch(vec![IndexOp::ClearHolder { holder: engine() }]));
    assert_eq!(ix.announcements(0, key, tier_bit(Tier::CpuLocal)), 0);
    ix.apply(&batch(vec![chained(&tokens, 0, 1, "", Tier::CpuLocal)]));
    ix.apply(&batch(vec![IndexOp::Remove {
        holder: engine(),
        tier: Tier::CpuLocal,
        hashes: engine_hashes(0..1),
    }]));
    assert_eq!(
        ix.stats().holder_blocks,
        0,
        "one store after the clear, one remove"
    );
}

#[test]
fn a_salted_chain_only_answers_queries_with_the_same_salt() {
    let mut ix = index();
    let tokens = prompt(2);
    ix.apply(&batch(vec![chained(&tokens, 0, 2, "s1", Tier::Device)]));
    assert_eq!(device(&ix, &tokens, "s1"), 8);
    assert_eq!(device(&ix, &tokens, ""), 0);
    assert_eq!(device(&ix, &tokens, "s2"), 0);
}

#[test]
fn an_unknown_parent_keeps_the_blocks_under_their_hashes() {
    let mut ix = index();
    let tokens = prompt(3);
    // Joined mid-stream: blocks 1..3 arrive with a parent this context never saw.
    let report = ix.apply(&batch(vec![chained(&tokens, 1, 3, "", Tier::Device)]));
    assert_eq!((report.translated, report.unlinked), (0, 2));
    assert_eq!(
        ix.shared
            .unlinked
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    assert_eq!(
        ix.shared
            .raw_pairs
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    // Not guessed from tokens: the prefix is missing block 0 anyway, and the hashes are not the
    // registered profile's, so nothing answers.
    ix.apply(&batch(vec![chained(&tokens, 0, 1, "", Tier::Device)]));
    assert_eq!(device(&ix, &tokens, ""), 4);
    // Removing them by hash still works.
    ix.apply(&batch(vec![IndexOp::Remove {
        holder: engine(),
        tier: Tier::Device,
        hashes: engine_hashes(1..3),
    }]));
    assert_eq!(
        ix.shared
            .raw_pairs
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert_eq!(ix.stats().holder_blocks, 1);
}

#[test]
fn store_objects_follow_aliases_and_otherwise_the_registered_profile() {
    let mut ix = index();
    let tokens = prompt(3);
    ix.apply(&batch(vec![chained(&tokens, 0, 1, "", Tier::Device)]));
    // The registered profile's hashes of blocks 1 and 2, as a store names objects its engine
    // hashed with the registered recipe before this context saw their contents.
    let hasher = vllm_profile().hasher("", "");
    let mut chain = hasher.chain(BS, &tokens);
    let registered: Vec<BlockHash> = (0..3).map(|i| chain.try_key(i).unwrap()).collect();
    let store = SubscriptionKey::new("store", "", 0);
    let backend = Holder::Shared {
        backend_id: "b".into(),
    };
    let object = |hashes: Vec<BlockHash>| IndexBatch {
        source: store.clone(),
        ops: vec![IndexOp::StoreAliased {
            holder: backend.clone(),
            tier: Tier::CpuShare,
            hashes,
        }],
    };
    // Block 0 by the engine's hash (an alias), blocks 1-2 by the registered profile's.
    ix.apply(&object(engine_hashes(0..1)));
    ix.apply(&object(registered[1..].to_vec()));
    let hits = ix.reader().query_tokens(&tokens, "", None);
    let rank = hits.hits["i"].rank_matches[&0];
    assert_eq!((rank.device, rank.cpu_share), (4, 12));
    // The store's removal of block 1 by the same hash ends the shared prefix there.
    ix.apply(&IndexBatch {
        source: store,
        ops: vec![IndexOp::Remove {
            holder: backend,
            tier: Tier::CpuShare,
            hashes: registered[1..2].to_vec(),
        }],
    });
    let hits = ix.reader().query_tokens(&tokens, "", None);
    assert_eq!(hits.hits["i"].rank_matches[&0].cpu_share, 4);
}

#[test]
fn counts_and_aliases_survive_a_checkpoint() {
    let mut ix = index();
    let tokens = prompt(2);
    let store = chained(&tokens, 0, 2, "", Tier::Device);
    ix.apply(&batch(vec![store.clone(), store]));
    let changes = ix.take_changes();
    assert_eq!(changes.aliases.len(), 2);
    assert_eq!(changes.repeats.len(), 2);
    let mut restorer = Restorer::new(changes.key.clone(), changes.profile.clone());
    for h in &changes.holders {
        restorer.holder(h).expect("holder record");
    }
    for a in changes.attachments.iter().flatten() {
        restorer.attach(&a.source, &a.instance_id, a.dp_rank);
    }
    for &(hash, key) in &changes.aliases {
        restorer.alias(hash, key.unwrap());
    }
    for p in &changes.pairs {
        assert!(restorer.pair(p.holder, p.block, p.bits));
    }
    for &(h, b, bit, n) in &changes.repeats {
        assert!(restorer.repeat(h, b, bit, n));
    }
    let mut copy = restorer.finish();
    assert_eq!(device(&copy, &tokens, ""), 8);
    // The restored context knows which source fed it (removals after a restart route by it).
    assert!(copy.reader().fed_by(&source()));
    assert!(!copy.reader().fed_by(&SubscriptionKey::new("other", "", 0)));
    assert!(!copy.has_changes());
    // One removal by hash leaves the second copy, exactly as before the restart.
    copy.apply(&batch(vec![IndexOp::Remove {
        holder: engine(),
        tier: Tier::Device,
        hashes: engine_hashes(0..1),
    }]));
    assert_eq!(device(&copy, &tokens, ""), 8);
    // And the next event still links to the restored aliases.
    let tokens3 = prompt(3);
    let report = copy.apply(&batch(vec![chained(&tokens3, 2, 3, "", Tier::Device)]));
    assert_eq!(report.translated, 1);
    assert_eq!(device(&copy, &tokens3, ""), 12);
}

/// Differential: one random sequence of engine stores, removes and clears, applied to an index
/// as chained stores under unnameable engine hashes and removals by those hashes, and to another
/// as plain stores of the keys derived by hand. Every query from tokens must agree, and so must
/// the pair counts: translation is exact.
#[test]
fn translated_stores_answer_as_stores_of_the_derived_keys() {
    use crate::test_rng::Rng;
    const N: usize = 14;
    let tokens = prompt(N);
    let bs = BS as usize;
    let mut derived_keys = Vec::new();
    let mut parent = derived::ROOT;
    for b in 0..N {
        let block = tokens[b * bs..(b + 1) * bs].iter().map(|&t| i64::from(t));
        parent = derived::link(parent, derived::content(block, bs, 0));
        derived_keys.push(BlockHash(parent));
    }
    let holders: Vec<Holder> = (0..3)
        .map(|r| Holder::Engine {
            instance_id: "i".into(),
            dp_rank: r,
            group: 0,
        })
        .collect();
    for seed in [1u64, 0xfeed, 0x5eed_0002] {
        let mut rng = Rng(seed);
        let (mut translated, mut plain) = (index(), index());
        let mut announced = [false; N];
        for step in 0..1500 {
            let holder = rng.pick(&holders).clone();
            let tier = *rng.pick(&[Tier::Device, Tier::CpuLocal, Tier::Disk]);
            let (a, b) = match rng.below(10) {
                0..=4 => {
                    // A run that starts a sequence or continues an announced block.
                    let starts: Vec<usize> =
                        (0..N).filter(|&s| s == 0 || announced[s - 1]).collect();
                    let from = *rng.pick(&starts);
                    let to = (from + 1 + rng.below(4)).min(N);
                    announced[from..to].iter_mut().for_each(|x| *x = true);
                    let IndexOp::StoreChained { contents, .. } =
                        chained(&tokens, from, to, "", tier)
                    else {
                        unreachable!()
                    };
                    let a = IndexOp::StoreChained {
                        holder: holder.clone(),
                        tier,
                        hashes: engine_hashes(from as u64..to as u64),
                        contents,
                    };
                    let b = IndexOp::Store {
                        holder,
                        tier,
                        hashes: derived_keys[from..to].to_vec(),
                    };
                    (a, b)
                }
                5..=8 => {
                    let picked: Vec<usize> = (0..N).filter(|_| rng.below(3) == 0).collect();
                    let a = IndexOp::Remove {
                        holder: holder.clone(),
                        tier,
                        hashes: picked
                            .iter()
                            .map(|&i| BlockHash(0xeeee_0000 + i as u64))
                            .collect(),
                    };
                    let b = IndexOp::Remove {
                        holder,
                        tier,
                        hashes: picked.iter().map(|&i| derived_keys[i]).collect(),
                    };
                    (a, b)
                }
                _ => (
                    IndexOp::ClearHolder {
                        holder: holder.clone(),
                    },
                    IndexOp::ClearHolder { holder },
                ),
            };
            translated.apply(&batch(vec![a]));
            plain.apply(&batch(vec![b]));
            let n = rng.below(N + 1) * bs;
            let got = translated.reader().query_tokens(&tokens[..n], "", None);
            let want = plain.reader().query_tokens(&tokens[..n], "", None);
            assert_eq!(got, want, "seed {seed:#x} step {step}");
            assert_eq!(
                translated.stats().holder_blocks,
                plain.stats().holder_blocks,
                "seed {seed:#x} step {step}"
            );
        }
        assert!(plain.stats().holder_blocks > 0, "the run kept some blocks");
    }
}

/// Many published hashes naming one live block (one content announced under ever new hashes)
/// keep their aliases, and sweeping them stays amortized: a sweep runs only after the aliases
/// doubled since the last one.
#[test]
fn alias_sweeps_stay_amortized_when_many_hashes_name_one_block() {
    let mut ix = index();
    let tokens = prompt(1);
    let n = 20_000u64;
    for i in 0..n {
        let IndexOp::StoreChained { contents, .. } = chained(&tokens, 0, 1, "", Tier::Device)
        else {
            unreachable!()
        };
        ix.apply(&batch(vec![IndexOp::StoreChained {
            holder: engine(),
            tier: Tier::Device,
            hashes: vec![BlockHash(0xaaaa_0000_0000 + i)],
            contents,
        }]));
    }
    assert_eq!(ix.stats().blocks, 1);
    assert_eq!(
        ix.shared.aliases.len() as u64,
        n,
        "every alias names a live block"
    );
    // 20k aliases from a 4096 start: at most log2(20k / 4096) + 1 sweeps (a sweep on every
    // batch past the first threshold would be about 16k).
    assert!(ix.alias_sweeps <= 4, "{} sweeps", ix.alias_sweeps);
    assert!(ix.alias_sweeps >= 1);
}

#[test]
fn a_walk_follows_a_stored_run_record_by_record_and_stops_where_a_block_differs() {
    let mut ix = index();
    let n = 200;
    let tokens = prompt(n);
    // Stored as an engine publishes a long prompt: events of 16 blocks, each chained to the
    // last, so each segment's blocks are neighbouring records the walk follows in one read.
    let events = (0..n)
        .step_by(16)
        .map(|s| chained(&tokens, s, (s + 16).min(n), "", Tier::Device))
        .collect();
    ix.apply(&batch(events));
    let bs = u64::from(BS);
    assert_eq!(device(&ix, &tokens, ""), n as u64 * bs);
    let hashes: Vec<u64> = engine_hashes(0..n as u64).iter().map(|h| h.0).collect();
    assert_eq!(
        ix.reader().query_hashes(&hashes, None).hits["i"].device,
        n as u64 * bs
    );
    // Block 100 evicted: its record is free, so following stops there.
    ix.apply(&batch(vec![IndexOp::Remove {
        holder: engine(),
        tier: Tier::Device,
        hashes: engine_hashes(100..101),
    }]));
    assert_eq!(device(&ix, &tokens, ""), 100 * bs);
    // Stored again in another tier: the same key with another value, which ends the device
    // phase there while the cpu_local phase goes on to the end.
    ix.apply(&batch(vec![chained(&tokens, 100, 101, "", Tier::CpuLocal)]));
    let hits = ix.reader().query_tokens(&tokens, "", None);
    let t = hits.hits["i"].rank_matches[&0];
    assert_eq!((t.device, t.cpu_local), (100 * bs, n as u64 * bs));
    let by_hash = ix.reader().query_hashes(&hashes, None).hits["i"].rank_matches[&0];
    assert_eq!(by_hash, t, "by hash and from tokens agree");
    // A prompt that leaves the stored run inside a segment stops at the first other block.
    let mut other = tokens.clone();
    other[150 * BS as usize] += 1;
    let t = ix.reader().query_tokens(&other, "", None).hits["i"].rank_matches[&0];
    assert_eq!((t.device, t.cpu_local), (100 * bs, 150 * bs));
    assert_eq!(
        ix.shared
            .raw_pairs
            .load(std::sync::atomic::Ordering::Relaxed),
        0,
        "every block is keyed by its derived key"
    );
}
