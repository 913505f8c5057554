//! The trace replay's preparation, all outside the timed runs: every prompt's keys in each
//! index's terms, and per fleet size the schedule of operations, made by one lockstep replay
//! that also checks the indexes' answers.
//!
//! The lockstep replay drives the simulated fleet (`benches/trace_sim/`) request by request:
//! every index is asked for the prompt with everything before applied; the answers, per
//! engine, must equal each other and the fleet's truth; the simulator's KV-aware router picks
//! the engine from our answer and the engine's load; the admission's events go to every index.
//! The schedule keeps, per request, its arrival, the prompt, the chosen engine, the true prefix
//! there and the events, so every timed run replays the same operations.

use std::collections::HashMap;

use dynamo_kv_router::protocols::{
    BlockHashOptions, LocalBlockHash, compute_block_hash_for_seq, compute_seq_hash_for_block,
};
use mooncake_conductor::hashing::PrefixKeys;
use mooncake_conductor::hashing::derived::{self, BlockRule, DerivedChain};
use mooncake_conductor::model::BlockHash;

use crate::trace_index::{Crtc, Ours, Pool, Side};
use crate::trace_sim::fleet::{Event, EventCounts, Fleet, HitRate, Policy, Router};
use crate::trace_sim::{BLOCK_SIZE, Prompts, Request};

/// One prompt's complete blocks in every index's terms.
pub struct PromptKeys {
    /// The engines' published hashes (`vllm_v1`, `sha256_cbor`, low 64 bits).
    pub published: Vec<u64>,
    /// Our content digest of each block (stores carry them).
    pub digests: Vec<u64>,
    /// Our derived keys (our queries walk them).
    pub derived: Vec<BlockHash>,
    /// Dynamo's local block hash (XXH3 of the block's tokens; its queries walk them).
    pub local: Vec<LocalBlockHash>,
    /// Dynamo's rolling sequence hash (its events name blocks by it).
    pub sequence: Vec<u64>,
}

/// Every prompt's keys, and Dynamo's sequence hash of every published hash (removals name a
/// block by its published hash only).
pub struct Prep {
    pub prompts: Vec<PromptKeys>,
    pub sequence_of: HashMap<u64, u64>,
}

/// One request of the schedule.
pub struct Step {
    pub arrival_ms: u64,
    /// The request's prompt in [`Prep::prompts`].
    pub prompt: usize,
    pub engine: usize,
    /// The true cached prefix on `engine` when the request arrived (blocks).
    pub hit: u32,
    /// Published hashes of the blocks evicted, one `BlockRemoved` each, in order.
    pub removed: Vec<u64>,
    /// Prompt blocks `first..first + n` stored (one `BlockStored`), after the removals.
    pub stored: Option<(usize, usize)>,
}

impl Step {
    pub fn stored_blocks(&self) -> usize {
        self.stored.map_or(0, |s| s.1)
    }
}

pub fn prepare(requests: &[Request]) -> Prep {
    let mut prompts = Prompts::new();
    let mut sequence_of = HashMap::new();
    let keys = (requests.iter())
        .map(|r| {
            let p = prompts.prompt(r);
            let blocks = p.keys.len();
            let tokens = &p.tokens[..blocks * BLOCK_SIZE];
            let mut chain = DerivedChain::new(BlockRule::FullBlocks, BLOCK_SIZE as u32, tokens, "");
            let derived = (0..chain.num_blocks()).map(|i| chain.key(i)).collect();
            let digests = (tokens.chunks_exact(BLOCK_SIZE))
                .map(|b| derived::content(b.iter().map(|&t| i64::from(t)), b.len(), 0))
                .collect();
            let as_u32: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
            let local =
                compute_block_hash_for_seq(&as_u32, BLOCK_SIZE as u32, BlockHashOptions::default());
            let sequence = compute_seq_hash_for_block(&local);
            for (k, s) in p.keys.iter().zip(&sequence) {
                sequence_of.insert(*k, *s);
            }
            PromptKeys {
                published: p.keys,
                digests,
                derived,
                local,
                sequence,
            }
        })
        .collect();
    Prep {
        prompts: keys,
        sequence_of,
    }
}

/// What the lockstep replay found.
#[derive(Default)]
pub struct Check {
    pub queries: usize,
    /// Queries some engine matched, and those of them no engine matched in full.
    pub with_hit: usize,
    pub partial: usize,
    /// Per index (in [`crate::trace_index::KINDS`] order): queries whose per-engine answer
    /// differed from the truth.
    pub wrong: [usize; 4],
    /// The first few differences, printable.
    pub examples: Vec<String>,
    pub hits: HitRate,
    pub counts: EventCounts,
}

/// The lockstep replay of `requests` over `engines` engines of `capacity` blocks: the schedule
/// and the check.
pub fn lockstep(
    requests: &[Request],
    prep: &Prep,
    engines: usize,
    capacity: usize,
) -> (Vec<Step>, Check) {
    let mut ours = Ours::new(engines);
    let mut crtc = Crtc::new(engines);
    let mut pool = Pool::crtc(engines);
    let mut positional = Pool::positional(engines);
    let mut fleet = Fleet::new(engines, capacity);
    let mut router = Router::new(Policy::KvAware);
    let mut check = Check::default();
    let mut steps = Vec::with_capacity(requests.len());
    let mut answers = vec![Vec::new(); 4];
    for (n, r) in requests.iter().enumerate() {
        fleet.advance(r.arrival_ms);
        let keys = &prep.prompts[n];
        answer(&mut ours, prep, n, engines, &mut answers[0]);
        answer(&mut crtc, prep, n, engines, &mut answers[1]);
        answer(&mut pool, prep, n, engines, &mut answers[2]);
        answer(&mut positional, prep, n, engines, &mut answers[3]);
        let truth: Vec<u32> = (fleet.truth(&keys.published).into_iter())
            .map(|t| t as u32)
            .collect();
        compare(&mut check, n, &truth, &answers, keys.published.len() as u32);
        let matched: Vec<usize> = answers[0].iter().map(|&m| m as usize).collect();
        let e = router.choose(keys.published.len(), &matched, &fleet.load());
        let prompt = crate::trace_sim::Prompt {
            tokens: Vec::new(),
            keys: keys.published.clone(),
        };
        let a = fleet.admit(e, &prompt, r.arrival_ms, r.duration_ms());
        check.hits.add(r, a.hit_blocks);
        check.counts.add(&a);
        let mut step = Step {
            arrival_ms: r.arrival_ms,
            prompt: n,
            engine: e,
            hit: a.hit_blocks as u32,
            removed: Vec::new(),
            stored: None,
        };
        for ev in &a.events {
            match ev {
                Event::Removed(key) => step.removed.push(*key),
                Event::Stored { first, keys, .. } => step.stored = Some((*first, keys.len())),
            }
        }
        feed(&mut ours, &step, prep);
        feed(&mut crtc, &step, prep);
        feed(&mut pool, &step, prep);
        feed(&mut positional, &step, prep);
        steps.push(step);
    }
    (steps, check)
}

fn answer<S: Side>(side: &mut S, prep: &Prep, prompt: usize, engines: usize, out: &mut Vec<u32>) {
    side.query(prep, prompt);
    out.clear();
    out.extend((0..engines).map(|e| side.matched(e)));
}

fn feed<S: Side>(side: &mut S, step: &Step, prep: &Prep) {
    let payload = side.payload(step, prep);
    side.send(payload);
    side.flush();
}

fn compare(check: &mut Check, n: usize, truth: &[u32], answers: &[Vec<u32>], blocks: u32) {
    check.queries += 1;
    let best = truth.iter().copied().max().unwrap_or(0);
    check.with_hit += usize::from(best > 0);
    check.partial += usize::from(best > 0 && best < blocks);
    for (i, a) in answers.iter().enumerate() {
        if a.as_slice() != truth {
            check.wrong[i] += 1;
            if check.examples.len() < 5 {
                let e = (0..truth.len()).find(|&e| a[e] != truth[e]).unwrap_or(0);
                check.examples.push(format!(
                    "request {n}, {}: engine {e} answered {} blocks, truth {}",
                    crate::trace_index::KINDS[i],
                    a[e],
                    truth[e]
                ));
            }
        }
    }
}
