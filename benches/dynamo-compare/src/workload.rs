//! The one deterministic workload both indexes see: prompts as token ids, the publisher batches
//! engines would emit while caching them, and the sampled queries.
//!
//! Blocks are named by (prompt, block index) here, never by a hash: each index derives its own
//! keys from the token ids, so both see the same block identities (two blocks are the same block
//! exactly when their token prefixes are equal) without sharing a hash function.

use std::collections::HashSet;

/// Tokens per block, for both indexes.
pub const BLOCK_SIZE: usize = 16;
/// DP ranks per instance.
pub const RANKS: usize = 2;
const SYSTEM_PROMPTS: usize = 32;
/// Largest store event, in blocks (engines publish a prompt as several events).
const MAX_EVENT_BLOCKS: usize = 16;
/// Share of stored prompts whose tail a later event evicts.
const EVICT_PERCENT: u64 = 15;
/// Tokens per query: 128 blocks.
pub const QUERY_TOKENS: usize = 2_048;
const QUERIES: usize = 3_000;

/// How large the fleet and its caches are.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub instances: usize,
    /// Prompts that holders cache (each holder picks from these).
    pub stored_prompts: usize,
    /// Prompts that only queries use, so that some queries match nothing beyond a system prompt.
    pub unstored_prompts: usize,
    pub prompts_per_holder: usize,
}

impl Shape {
    /// 64 instances x 2 ranks, 350 prompts per holder from a pool of 4,000.
    pub const DEFAULT: Shape = Shape {
        instances: 64,
        stored_prompts: 4_000,
        unstored_prompts: 400,
        prompts_per_holder: 350,
    };

    /// `instances` x 2 ranks, each holder caching 128 prompts (about 7,800 blocks, 125 k
    /// tokens); the prompt pool grows with the fleet so that a prompt is cached by about 11
    /// holders, as in the default shape. 1,024 instances give about 16 M (block, holder) pairs.
    pub fn fleet(instances: usize) -> Shape {
        let stored = instances * RANKS * 12;
        Shape {
            instances,
            stored_prompts: stored,
            unstored_prompts: stored / 10,
            prompts_per_holder: 128,
        }
    }

    pub fn holders(&self) -> usize {
        self.instances * RANKS
    }
}
/// Vocabulary of the generated token ids.
const VOCAB: u64 = 50_000;

/// splitmix64: small, seeded, and the same on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    pub fn percent(&mut self, p: u64) -> bool {
        self.next_u64() % 100 < p
    }

    pub fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| (self.next_u64() % VOCAB) as u32).collect()
    }
}

/// A holder is one (instance, DP rank); its index is `instance * RANKS + rank`.
pub fn instance_of(holder: usize) -> usize {
    holder / RANKS
}

pub fn rank_of(holder: usize) -> usize {
    holder % RANKS
}

pub struct Prompt {
    /// Whole blocks only: `blocks() * BLOCK_SIZE` tokens.
    pub tokens: Vec<u32>,
    /// Leading blocks that are the prompt's system prompt (shared with other prompts).
    pub system_blocks: usize,
    /// Which system prompt.
    pub system: usize,
}

impl Prompt {
    pub fn blocks(&self) -> usize {
        self.tokens.len() / BLOCK_SIZE
    }
}

/// One engine event: blocks `start..end` of `prompt`. A store's parent is block `start - 1` of
/// the same prompt (none when `start == 0`).
#[derive(Debug, Clone, Copy)]
pub enum Event {
    Store { prompt: u32, start: u32, end: u32 },
    Remove { prompt: u32, start: u32, end: u32 },
}

impl Event {
    pub fn blocks(&self) -> u64 {
        match *self {
            Event::Store { start, end, .. } | Event::Remove { start, end, .. } => {
                u64::from(end - start)
            }
        }
    }
}

/// What one engine publishes in one message: its events of one scheduler step, in order.
pub struct PublisherBatch {
    pub holder: usize,
    pub events: Vec<Event>,
}

pub struct Workload {
    pub shape: Shape,
    /// `stored_prompts` prompts that holders cache, then `unstored_prompts` that none does.
    pub prompts: Vec<Prompt>,
    /// Every batch, already interleaved across holders in publication order.
    pub batches: Vec<PublisherBatch>,
    /// Distinct (block, holder) pairs held once every batch is applied.
    pub live_pairs: u64,
    /// Block ops in all events (stored plus removed blocks).
    pub block_ops: u64,
    /// Queries of exactly `QUERY_TOKENS` tokens.
    pub queries: Vec<Vec<u32>>,
    /// Per holder, once every batch is applied: each cached prompt and the end of its blocks
    /// still held (blocks `0..end` of it are held, the system ones maybe through another
    /// prompt), in the order the holder cached them.
    pub holdings: Vec<Vec<(u32, u32)>>,
}

impl Workload {
    pub fn holders(&self) -> usize {
        self.shape.holders()
    }
}

pub fn generate(seed: u64, shape: Shape) -> Workload {
    let Shape {
        stored_prompts,
        unstored_prompts,
        prompts_per_holder,
        ..
    } = shape;
    let holders = shape.holders();
    let mut rng = Rng::new(seed);
    let systems: Vec<Vec<u32>> = (0..SYSTEM_PROMPTS)
        .map(|_| {
            let blocks = rng.range(4, 32);
            rng.tokens(blocks * BLOCK_SIZE)
        })
        .collect();
    let mut prompts = Vec::with_capacity(stored_prompts + unstored_prompts);
    for _ in 0..stored_prompts + unstored_prompts {
        let s = rng.range(0, SYSTEM_PROMPTS - 1);
        let own = rng.range(8, 120);
        let mut tokens = systems[s].clone();
        tokens.extend(rng.tokens(own * BLOCK_SIZE));
        prompts.push(Prompt {
            tokens,
            system_blocks: systems[s].len() / BLOCK_SIZE,
            system: s,
        });
    }

    // Each holder's own stream of batches: one per prompt it caches, plus delayed evictions.
    let mut per_holder: Vec<Vec<PublisherBatch>> = Vec::with_capacity(holders);
    let mut holdings = Vec::with_capacity(holders);
    let mut live_pairs = 0u64;
    let mut block_ops = 0u64;
    let mut evicted_prompts = HashSet::new();
    for holder in 0..holders {
        let mut chosen = HashSet::new();
        while chosen.len() < prompts_per_holder {
            chosen.insert(rng.range(0, stored_prompts - 1));
        }
        let mut order: Vec<usize> = chosen.into_iter().collect();
        order.sort_unstable();
        // A fixed shuffle, so the order does not depend on the hash set's iteration.
        for i in (1..order.len()).rev() {
            order.swap(i, rng.range(0, i));
        }
        let mut systems_held = HashSet::new();
        // (batches still to wait, event) of scheduled evictions.
        let mut pending: Vec<(usize, Event)> = Vec::new();
        let mut stream = Vec::new();
        let mut held: Vec<(u32, u32)> = Vec::with_capacity(order.len());
        for p in order {
            let prompt = &prompts[p];
            let n = prompt.blocks();
            // An engine publishes only blocks it computed: a system prompt it already caches
            // is reused, and the store event starts below it.
            held.push((p as u32, n as u32));
            let mut start = if systems_held.insert(prompt.system) {
                0
            } else {
                prompt.system_blocks
            };
            live_pairs += (n - start) as u64;
            let mut events = Vec::new();
            for pending_event in pending.iter_mut() {
                pending_event.0 -= 1;
            }
            pending.retain(|(wait, ev)| {
                if *wait == 0 {
                    events.push(*ev);
                }
                *wait > 0
            });
            while start < n {
                let len = rng
                    .range(MAX_EVENT_BLOCKS / 2, MAX_EVENT_BLOCKS)
                    .min(n - start);
                events.push(Event::Store {
                    prompt: p as u32,
                    start: start as u32,
                    end: (start + len) as u32,
                });
                start += len;
            }
            if rng.percent(EVICT_PERCENT) {
                // Evict the last k of the prompt's own blocks: a tail no other prompt shares.
                let own = n - prompt.system_blocks;
                let k = rng.range(1, own);
                live_pairs -= k as u64;
                evicted_prompts.insert(p);
                held.last_mut().expect("pushed above").1 = (n - k) as u32;
                let ev = Event::Remove {
                    prompt: p as u32,
                    start: (n - k) as u32,
                    end: n as u32,
                };
                pending.push((rng.range(1, 5), ev));
            }
            block_ops += events.iter().map(Event::blocks).sum::<u64>();
            stream.push(PublisherBatch { holder, events });
        }
        if !pending.is_empty() {
            let events: Vec<Event> = pending.into_iter().map(|(_, ev)| ev).collect();
            block_ops += events.iter().map(Event::blocks).sum::<u64>();
            stream.push(PublisherBatch { holder, events });
        }
        stream.reverse(); // popped from the back below
        per_holder.push(stream);
        holdings.push(held);
    }

    // Interleave the holders' streams: each step publishes the next batch of a random holder
    // that has one left, keeping every holder's own order.
    let mut batches = Vec::new();
    let mut active: Vec<usize> = (0..holders).collect();
    while !active.is_empty() {
        let i = rng.range(0, active.len() - 1);
        match per_holder[active[i]].pop() {
            Some(b) => batches.push(b),
            None => {
                active.swap_remove(i);
            }
        }
    }

    let mut evicted: Vec<usize> = evicted_prompts.into_iter().collect();
    evicted.sort_unstable();
    let mut queries = Vec::with_capacity(QUERIES);
    for q in 0..QUERIES {
        let p = match q % 3 {
            0 => rng.range(0, stored_prompts - 1),
            1 => evicted[rng.range(0, evicted.len() - 1)],
            _ => rng.range(stored_prompts, stored_prompts + unstored_prompts - 1),
        };
        let src = &prompts[p].tokens;
        // A prefix of the prompt, cut anywhere (also inside a block), then unseen tokens.
        let keep = rng.range(src.len() / 2, src.len()).min(QUERY_TOKENS);
        let mut tokens = src[..keep].to_vec();
        tokens.extend(rng.tokens(QUERY_TOKENS - keep));
        queries.push(tokens);
    }
    // A few queries that share nothing with any stored prompt.
    for q in queries.iter_mut().step_by(50) {
        *q = rng.tokens(QUERY_TOKENS);
    }

    Workload {
        shape,
        prompts,
        batches,
        live_pairs,
        block_ops,
        queries,
        holdings,
    }
}
