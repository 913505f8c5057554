//! Differential test: random attach / store / remove / clear / drop / detach sequences over
//! several contexts, checked after every step against a naive model written from the spec's
//! words. Seeds are fixed; a failure names its seed and step.

use std::collections::{BTreeMap, BTreeSet};

use crate::events::{Holder, IndexBatch, IndexOp};
use crate::model::{BlockHash, ContextKey, SubscriptionKey, Tier};

use super::tests::{TestKeys, test_profile};
use super::{ContextIndex, ContextSnapshot, QueryHits, TierCounts};
use crate::test_rng::Rng;

/// How the reference model walks; everything but `Spec` is deliberately wrong, to show the
/// harness notices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    Spec,
    /// Each phase only accepts its own tier (the reference implementation's predicate).
    OwnTierOnly,
    /// Skips missing blocks instead of stopping at the first one.
    NoGapStop,
    /// Goes back to the device tier: device counts every device block before the walk's end.
    DeviceResumes,
    /// Merges repeated stores (set semantics): one remove drops a block stored twice.
    MergesRepeats,
}

/// The naive model: announcement counts of (hash, source, holder, tier) facts (present while
/// above zero) and a list of rank listings.
#[derive(Default)]
struct Model {
    merges: bool,
    facts: BTreeMap<(u64, SubscriptionKey, Holder, Tier), u32>,
    listed: BTreeSet<(SubscriptionKey, String, u32)>,
}

/// "Engine holders can hold Device, CpuLocal, Disk"; shared holders "cpu_share/disk bits only".
fn allowed(holder: &Holder, tier: Tier) -> bool {
    match holder {
        Holder::Engine { .. } => matches!(tier, Tier::Device | Tier::CpuLocal | Tier::Disk),
        Holder::Shared { .. } => matches!(tier, Tier::CpuShare | Tier::Disk),
    }
}

impl Model {
    fn apply(&mut self, batch: &IndexBatch) {
        let s = &batch.source;
        for op in &batch.ops {
            match op {
                IndexOp::Store {
                    holder,
                    tier,
                    hashes,
                } if allowed(holder, *tier) => {
                    if let Holder::Engine {
                        instance_id,
                        dp_rank,
                        ..
                    } = holder
                    {
                        self.listed
                            .insert((s.clone(), instance_id.clone(), *dp_rank));
                    }
                    for h in hashes {
                        let n = self
                            .facts
                            .entry((h.0, s.clone(), holder.clone(), *tier))
                            .or_default();
                        *n = if self.merges { 1 } else { *n + 1 };
                    }
                }
                IndexOp::Remove {
                    holder,
                    tier,
                    hashes,
                } if allowed(holder, *tier) => {
                    for h in hashes {
                        let fact = (h.0, s.clone(), holder.clone(), *tier);
                        if let Some(n) = self.facts.get_mut(&fact) {
                            *n -= 1;
                            if *n == 0 {
                                self.facts.remove(&fact);
                            }
                        }
                    }
                }
                IndexOp::ClearHolder { holder } => {
                    self.facts.retain(|f, _| !(&f.1 == s && &f.2 == holder))
                }
                _ => {}
            }
        }
    }

    fn drop_source(&mut self, s: &SubscriptionKey) {
        self.facts.retain(|f, _| &f.1 != s);
    }

    fn detach(&mut self, s: &SubscriptionKey) {
        self.drop_source(s);
        self.listed.retain(|l| &l.0 != s);
    }

    fn instances(&self) -> BTreeMap<String, BTreeSet<u32>> {
        let mut out: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        for (_, i, r) in &self.listed {
            out.entry(i.clone()).or_default().insert(*r);
        }
        out
    }

    fn prefix_count(&self) -> u64 {
        self.facts
            .keys()
            .map(|f| f.0)
            .collect::<BTreeSet<_>>()
            .len() as u64
    }

    fn holder_blocks(&self) -> u64 {
        self.facts
            .keys()
            .map(|f| (f.0, &f.1, &f.2))
            .collect::<BTreeSet<_>>()
            .len() as u64
    }

    /// Is block `hash` available to (instance, rank) from `tier` or an earlier one? Device and
    /// cpu_local (and engine disk) count only for the rank's own holder; shared tiers for all.
    fn held(&self, hash: u64, instance: &str, rank: u32, phase: usize, walk: Walk) -> bool {
        let first = (
            hash,
            min_source(),
            Holder::Engine {
                instance_id: String::new(),
                dp_rank: 0,
                group: 0,
            },
            Tier::Device,
        );
        self.facts
            .range(first..)
            .take_while(|f| f.0.0 == hash)
            .any(|((_, _, holder, tier), _)| {
                let tier_ok = if walk == Walk::OwnTierOnly {
                    tier.index() == phase
                } else {
                    tier.index() <= phase
                };
                let visible = match holder {
                    Holder::Engine {
                        instance_id,
                        dp_rank,
                        ..
                    } => instance_id == instance && *dp_rank == rank,
                    Holder::Shared { .. } => true,
                };
                tier_ok && visible
            })
    }

    /// The spec's walk for one rank: (four token counts, the block where the last phase stopped).
    fn walk_rank(
        &self,
        keys: &TestKeys,
        instance: &str,
        rank: u32,
        walk: Walk,
    ) -> ([u64; 4], usize) {
        let n = keys.hashes.len();
        let mut counts = [0u64; 4];
        let mut c = 0;
        for (phase, count) in counts.iter_mut().enumerate() {
            while c < n {
                let held = self.held(keys.hashes[c].0, instance, rank, phase, walk);
                let skips_gap = walk == Walk::NoGapStop
                    && (c + 1..n).any(|d| self.held(keys.hashes[d].0, instance, rank, phase, walk));
                if held || skips_gap {
                    c += 1;
                } else {
                    break;
                }
            }
            *count = (c as u64 * keys.block_size).min(keys.tokens);
        }
        if walk == Walk::DeviceResumes {
            let on_device = (0..c)
                .filter(|&b| self.held(keys.hashes[b].0, instance, rank, 0, walk))
                .count();
            counts[0] = (on_device as u64 * keys.block_size).min(keys.tokens);
        }
        (counts, c)
    }

    /// Expected answer and how many leading blocks the walk needs hashed.
    fn query(&self, keys: &TestKeys, filter: Option<&str>, walk: Walk) -> (QueryHits, usize) {
        let mut hits = QueryHits::default();
        let mut needed = 0;
        for (instance, ranks) in self.instances() {
            if filter.is_some_and(|f| f != instance) {
                continue;
            }
            let row = hits.hits.get_or_insert_default(instance.clone());
            for rank in ranks {
                let (c, stop) = self.walk_rank(keys, &instance, rank, walk);
                needed = needed.max((stop + 1).min(keys.hashes.len()));
                let t = TierCounts {
                    device: c[0],
                    cpu_local: c[1],
                    cpu_share: c[2],
                    disk: c[3],
                };
                row.dp.insert(rank, t.device);
                row.rank_matches.insert(rank, t);
                row.device = row.device.max(t.device);
                row.cpu_local = row.cpu_local.max(t.cpu_local);
                row.cpu_share = row.cpu_share.max(t.cpu_share);
                row.disk = row.disk.max(t.disk);
                row.longest_matched = row.disk;
            }
        }
        (hits, needed)
    }
}

/// The smallest possible source, to start a range scan over one block's facts.
fn min_source() -> SubscriptionKey {
    SubscriptionKey {
        instance_id: String::new(),
        tenant_id: String::new(),
        dp_rank: 0,
    }
}

const INSTANCES: [&str; 3] = ["i0", "i1", "i2"];
const BACKENDS: [&str; 2] = ["b0", "b1"];
/// Block keys of one long prompt; stores and queries use runs of it so prefixes really match.
const CHAIN_LEN: usize = 14;
const BS: u64 = 4;

fn chain(i: usize) -> u64 {
    0x1000 + i as u64
}

fn sources() -> Vec<SubscriptionKey> {
    let mut s: Vec<SubscriptionKey> = INSTANCES
        .iter()
        .flat_map(|i| (0..2).map(move |r| SubscriptionKey::new(i, "", r)))
        .collect();
    // A base registration feeding an adapter context, and two store subscriptions.
    s.push(SubscriptionKey::new("feeder", "", 0));
    s.push(SubscriptionKey::new("store-a", "", 0));
    s.push(SubscriptionKey::new("store-b", "", 0));
    s
}

/// A holder for a batch of `source`; in a `fleet` context (no store backend, every source
/// storing for its own rank) always the source's own rank, so its queries walk the direct way.
fn random_holder(rng: &mut Rng, source: &SubscriptionKey, fleet: bool) -> Holder {
    let is_store = source.instance_id.starts_with("store");
    if fleet {
        Holder::Engine {
            instance_id: source.instance_id.clone(),
            dp_rank: source.dp_rank,
            group: 0,
        }
    } else if is_store || rng.below(20) == 0 {
        Holder::Shared {
            backend_id: rng.pick(&BACKENDS).to_string(),
        }
    } else if source.instance_id == "feeder" || rng.below(10) == 0 {
        Holder::Engine {
            instance_id: rng.pick(&INSTANCES).to_string(),
            dp_rank: rng.below(3) as u32,
            group: 0,
        }
    } else {
        Holder::Engine {
            instance_id: source.instance_id.clone(),
            dp_rank: source.dp_rank,
            group: 0,
        }
    }
}

fn random_hashes(rng: &mut Rng) -> Vec<BlockHash> {
    if rng.below(8) == 0 {
        return (0..rng.below(4))
            .map(|_| BlockHash(chain(rng.below(CHAIN_LEN + 4))))
            .collect();
    }
    let start = rng.below(CHAIN_LEN);
    let len = 1 + rng.below(6);
    (start..(start + len).min(CHAIN_LEN))
        .map(|i| BlockHash(chain(i)))
        .collect()
}

fn random_prompt(rng: &mut Rng) -> TestKeys {
    let n = rng.below(CHAIN_LEN + 2);
    let mut hashes: Vec<u64> = (0..n).map(chain).collect();
    if n > 0 && rng.below(3) == 0 {
        let i = rng.below(n);
        hashes[i] = 0xdead;
    }
    let tokens = match n {
        0 => 0,
        // A partial final block, as the SGLang strategies count it.
        _ if rng.below(2) == 0 => (n as u64 - 1) * BS + 1 + rng.below(BS as usize - 1) as u64,
        _ => n as u64 * BS,
    };
    TestKeys::with_tokens(&hashes, tokens)
}

/// How often each tier boundary was seen moving in checked answers, and how many checked
/// queries walked their cursors each way (direct, counted: see `cursors`), so a run that never
/// exercised a tier or a way cannot pass silently.
#[derive(Debug, Default)]
struct Coverage {
    tiers: [u64; 4],
    walks: [u64; 2],
}

/// The context whose holders are always their source's own rank (see [`random_holder`]).
const FLEET_CONTEXT: usize = 2;

/// Run `steps` random steps from `seed`, comparing after each; `Err` names seed, step and diff.
fn run(seed: u64, steps: usize, walk: Walk) -> Result<Coverage, String> {
    let mut coverage = Coverage::default();
    let mut rng = Rng(seed);
    let sources = sources();
    let keys = ["ctx-a", "ctx-b", "ctx-c"].map(|m| ContextKey::new("", m, "", BS as u32));
    let mut indexes: Vec<(ContextIndex, Model)> = keys
        .iter()
        .map(|k| {
            (
                ContextIndex::new(k.clone(), test_profile()),
                Model {
                    merges: walk == Walk::MergesRepeats,
                    ..Model::default()
                },
            )
        })
        .collect();
    for step in 0..steps {
        let ctx = rng.below(indexes.len());
        let fleet = ctx == FLEET_CONTEXT;
        let (ix, model) = &mut indexes[ctx];
        let source = rng.pick(&sources).clone();
        // What the step applies besides its batch's ops (rank attach, source drop or detach)
        // happens in the arm; every arm yields the batch's ops.
        let ops = match rng.below(100) {
            0..=44 => {
                let holder = random_holder(&mut rng, &source, fleet);
                vec![IndexOp::Store {
                    holder,
                    tier: *rng.pick(&Tier::ALL),
                    hashes: random_hashes(&mut rng),
                }]
            }
            45..=69 => {
                let holder = random_holder(&mut rng, &source, fleet);
                vec![IndexOp::Remove {
                    holder,
                    tier: *rng.pick(&Tier::ALL),
                    hashes: random_hashes(&mut rng),
                }]
            }
            70..=74 => vec![IndexOp::ClearHolder {
                holder: random_holder(&mut rng, &source, fleet),
            }],
            75..=86 => {
                let (i, r) = (rng.pick(&INSTANCES).to_string(), rng.below(3) as u32);
                ix.attach_rank(&source, &i, r);
                model.listed.insert((source.clone(), i, r));
                vec![]
            }
            87..=93 => {
                ix.drop_source(&source);
                model.drop_source(&source);
                vec![]
            }
            _ => {
                ix.detach_source(&source);
                model.detach(&source);
                vec![]
            }
        };
        // Some batches carry a second op of the same source, as engine batches do (several
        // events per publisher step): per-batch state of the writer must not leak between ops.
        let mut action = IndexBatch {
            source: source.clone(),
            ops,
        };
        if !action.ops.is_empty() && rng.below(3) == 0 {
            let holder = random_holder(&mut rng, &source, fleet);
            let tier = *rng.pick(&Tier::ALL);
            let hashes = random_hashes(&mut rng);
            action.ops.push(match rng.below(3) {
                0 => IndexOp::Store {
                    holder,
                    tier,
                    hashes,
                },
                1 => IndexOp::Remove {
                    holder,
                    tier,
                    hashes,
                },
                _ => IndexOp::ClearHolder { holder },
            });
        }
        ix.apply(&action);
        model.apply(&action);
        let fail = |what: String| {
            format!("seed {seed:#x} step {step} context {ctx}: {what}\nlast action: {action:?}")
        };
        if ix.instances() != model.instances() {
            return Err(fail(format!(
                "instances {:?} != model {:?}",
                ix.instances(),
                model.instances()
            )));
        }
        if ix.prefix_count() != model.prefix_count()
            || ix.stats().holder_blocks != model.holder_blocks()
        {
            return Err(fail(format!(
                "counts {:?} != model {}/{}",
                ix.stats(),
                model.prefix_count(),
                model.holder_blocks()
            )));
        }
        if ix.is_empty_and_detached() != (model.facts.is_empty() && model.listed.is_empty()) {
            return Err(fail("is_empty_and_detached disagrees".into()));
        }
        for _ in 0..3 {
            let prompt = random_prompt(&mut rng);
            let filters = [None, Some("i0"), Some("i1"), Some("i2"), Some("nope")];
            for filter in filters {
                let mut keys = TestKeys::with_tokens(
                    &prompt.hashes.iter().map(|h| h.0).collect::<Vec<_>>(),
                    prompt.tokens,
                );
                let got = ix.query(&mut keys, filter);
                coverage.walks[usize::from(!ix.shared.meta.plan().direct)] += 1;
                let (want, needed) = model.query(&keys, filter, walk);
                if got != want {
                    return Err(fail(format!(
                        "query {:?} tokens {} filter {filter:?}\n got {got:?}\nwant {want:?}",
                        prompt.hashes, prompt.tokens
                    )));
                }
                for t in got.hits.values().flat_map(|row| row.rank_matches.values()) {
                    let grew = [
                        t.device > 0,
                        t.cpu_local > t.device,
                        t.cpu_share > t.cpu_local,
                        t.disk > t.cpu_share,
                    ];
                    coverage
                        .tiers
                        .iter_mut()
                        .zip(grew)
                        .for_each(|(n, g)| *n += u64::from(g));
                }
                let hashed = super::read::query::keys_hashed(needed, keys.hashes.len());
                if keys.first_asks() != (0..hashed).collect::<Vec<_>>() {
                    return Err(fail(format!(
                        "hashed blocks {:?}, walk looks up 0..{needed} and hashes 0..{hashed}",
                        keys.asked
                    )));
                }
            }
        }
        if step % 500 == 499 {
            let copy = ContextSnapshot::of(ix).restore();
            let mut k1 = TestKeys::full(&(0..CHAIN_LEN).map(chain).collect::<Vec<_>>());
            let mut k2 = TestKeys::full(&(0..CHAIN_LEN).map(chain).collect::<Vec<_>>());
            if copy.query(&mut k1, None) != ix.query(&mut k2, None) || copy.view() != ix.view() {
                return Err(fail("snapshot restore differs".into()));
            }
            if announcements(&copy) != announcements(ix) {
                return Err(fail("snapshot restore changed announcement counts".into()));
            }
        }
    }
    Ok(coverage)
}

/// Every (source, holder, tier) with its announced blocks, one entry per announcement, sorted.
fn announcements(ix: &ContextIndex) -> BTreeMap<(SubscriptionKey, Holder, Tier), Vec<u64>> {
    let mut out: BTreeMap<_, Vec<u64>> = BTreeMap::new();
    for batch in ContextSnapshot::of(ix).batches {
        for op in batch.ops {
            if let IndexOp::Store {
                holder,
                tier,
                hashes,
            } = op
            {
                out.entry((batch.source.clone(), holder, tier))
                    .or_default()
                    .extend(hashes.iter().map(|h| h.0));
            }
        }
    }
    out.values_mut().for_each(|v| v.sort_unstable());
    out
}

const SEEDS: [u64; 3] = [0x5eed_0001, 0xc0ff_ee00_1234, 0x0dd_ba11];

#[test]
fn index_matches_the_naive_model() {
    for seed in SEEDS {
        match run(seed, 2500, Walk::Spec) {
            Err(e) => panic!("differential test failed (rerun with this seed): {e}"),
            Ok(coverage) => {
                assert!(
                    coverage
                        .tiers
                        .iter()
                        .chain(&coverage.walks)
                        .all(|&n| n > 100),
                    "seed {seed:#x} barely exercised a tier or a walk: {coverage:?}"
                )
            }
        }
    }
}

#[test]
fn the_harness_catches_broken_walks() {
    for broken in [
        Walk::OwnTierOnly,
        Walk::NoGapStop,
        Walk::DeviceResumes,
        Walk::MergesRepeats,
    ] {
        let caught = SEEDS.iter().all(|&seed| run(seed, 2500, broken).is_err());
        assert!(
            caught,
            "a model with {broken:?} passed the differential test"
        );
    }
}
