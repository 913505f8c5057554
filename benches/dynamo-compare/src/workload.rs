//! The one deterministic workload both indexes see: prompts as token ids, the publisher batches
//! engines would emit while caching them, and the sampled queries.
//!
//! Blocks are named by (prompt, block index) here, never by a hash: each index derives its own
//! keys from the token ids, so both see the same block identities (two blocks are the same block
//! exactly when their token prefixes are equal) without sharing a hash function.

use std::collections::HashSet;

/// Tokens per block, for both indexes.
pub const BLOCK_SIZE: usize = 16;
pub const INSTANCES: usize = 64;
pub const RANKS: usize = 2;
pub const HOLDERS: usize = INSTANCES * RANKS;
const SYSTEM_PROMPTS: usize = 32;
const STORED_PROMPTS: usize = 4_000;
/// Prompts that only queries use, so that some queries match nothing beyond a system prompt.
const UNSTORED_PROMPTS: usize = 400;
const PROMPTS_PER_HOLDER: usize = 350;
/// Largest store event, in blocks (engines publish a prompt as several events).
const MAX_EVENT_BLOCKS: usize = 16;
/// Share of stored prompts whose tail a later event evicts.
const EVICT_PERCENT: u64 = 15;
/// Tokens per query: 128 blocks.
pub const QUERY_TOKENS: usize = 2_048;
const QUERIES: usize = 3_000;
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
    /// `STORED_PROMPTS` prompts that holders cache, then `UNSTORED_PROMPTS` that none does.
    pub prompts: Vec<Prompt>,
    /// Every batch, already interleaved across holders in publication order.
    pub batches: Vec<PublisherBatch>,
    /// Distinct (block, holder) pairs held once every batch is applied.
    pub live_pairs: u64,
    /// Block ops in all events (stored plus removed blocks).
    pub block_ops: u64,
    /// Queries of exactly `QUERY_TOKENS` tokens.
    pub queries: Vec<Vec<u32>>,
}

pub fn generate(seed: u64) -> Workload {
    let mut rng = Rng::new(seed);
    let systems: Vec<Vec<u32>> = (0..SYSTEM_PROMPTS)
        .map(|_| {
            let blocks = rng.range(4, 32);
            rng.tokens(blocks * BLOCK_SIZE)
        })
        .collect();
    let mut prompts = Vec::with_capacity(STORED_PROMPTS + UNSTORED_PROMPTS);
    let mut system_of = Vec::with_capacity(prompts.capacity());
    for _ in 0..STORED_PROMPTS + UNSTORED_PROMPTS {
        let s = rng.range(0, SYSTEM_PROMPTS - 1);
        let own = rng.range(8, 120);
        let mut tokens = systems[s].clone();
        tokens.extend(rng.tokens(own * BLOCK_SIZE));
        prompts.push(Prompt {
            tokens,
            system_blocks: systems[s].len() / BLOCK_SIZE,
        });
        system_of.push(s);
    }

    // Each holder's own stream of batches: one per prompt it caches, plus delayed evictions.
    let mut per_holder: Vec<Vec<PublisherBatch>> = Vec::with_capacity(HOLDERS);
    let mut live_pairs = 0u64;
    let mut block_ops = 0u64;
    let mut evicted_prompts = HashSet::new();
    for holder in 0..HOLDERS {
        let mut chosen = HashSet::new();
        while chosen.len() < PROMPTS_PER_HOLDER {
            chosen.insert(rng.range(0, STORED_PROMPTS - 1));
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
        for p in order {
            let prompt = &prompts[p];
            let n = prompt.blocks();
            // An engine publishes only blocks it computed: a system prompt it already caches
            // is reused, and the store event starts below it.
            let mut start = if systems_held.insert(system_of[p]) {
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
    }

    // Interleave the holders' streams: each step publishes the next batch of a random holder
    // that has one left, keeping every holder's own order.
    let mut batches = Vec::new();
    let mut active: Vec<usize> = (0..HOLDERS).collect();
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
            0 => rng.range(0, STORED_PROMPTS - 1),
            1 => evicted[rng.range(0, evicted.len() - 1)],
            _ => rng.range(STORED_PROMPTS, STORED_PROMPTS + UNSTORED_PROMPTS - 1),
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
        prompts,
        batches,
        live_pairs,
        block_ops,
        queries,
    }
}
