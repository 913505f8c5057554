//! The simulated engines (vLLM-like block pools), the ground truth they keep, the events they
//! publish, and the routers.
//!
//! A pool holds at most `capacity` blocks. A request admitted at time `t` first lets every
//! request that ended by `t` release its blocks, then reuses the longest cached prefix of its
//! prompt (pinning those blocks), and stores its further complete blocks, evicting the least
//! recently freed unpinned block whenever the pool is full. What cannot be stored because every
//! block is pinned is computed but not cached, as vLLM would have to (it would rather wait; the
//! simulation keeps arrival order). A request pins its blocks until `arrival + duration_ms`.
//!
//! A request frees its blocks deepest first (vLLM's free queue does the same), so a block is
//! always freed after its descendants and evicted before its ancestors: an engine's cache stays
//! closed under prefixes, and a stored run always continues a cached block or starts a chain.

use std::collections::{BTreeMap, HashMap};

use mooncake_conductor::test_rng::Rng;

use super::{BLOCK_SIZE, Prompt, Request};

/// What an engine publishes for one admission, in order (vLLM evicts while it allocates, then
/// caches the computed blocks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// One evicted block (vLLM's block pool publishes one `BlockRemoved` per block).
    Removed(u64),
    /// Prompt blocks `first..first + keys.len()` stored, continuing `parent` (`None`: from
    /// the start of the chain).
    Stored {
        parent: Option<u64>,
        first: usize,
        keys: Vec<u64>,
    },
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Running requests using the block.
    refs: u32,
    /// Its place in the free queue while `refs` is 0.
    freed_at: u64,
}

/// One engine (one DP rank): a block pool with prefix caching and LRU eviction.
pub struct Engine {
    capacity: usize,
    blocks: HashMap<u64, Entry>,
    /// Unpinned cached blocks by the order they were freed in: the first is evicted first.
    free: BTreeMap<u64, u64>,
    next_free: u64,
    /// The blocks running requests pin, by (end, admission number).
    running: BTreeMap<(u64, u64), Vec<u64>>,
    admitted: u64,
}

/// Counts of one admission.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admission {
    /// Prompt blocks already cached on the engine (the prefix-cache hit).
    pub hit_blocks: usize,
    /// Blocks the request computed and could not cache (pool full of pinned blocks).
    pub uncached_blocks: usize,
    pub events: Vec<Event>,
}

impl Engine {
    pub fn new(capacity: usize) -> Engine {
        Engine {
            capacity,
            blocks: HashMap::new(),
            free: BTreeMap::new(),
            next_free: 0,
            running: BTreeMap::new(),
            admitted: 0,
        }
    }

    /// Blocks of `keys` cached here, from the first: the true longest cached prefix.
    pub fn cached_prefix(&self, keys: &[u64]) -> usize {
        keys.iter()
            .take_while(|k| self.blocks.contains_key(k))
            .count()
    }

    pub fn holds(&self, key: u64) -> bool {
        self.blocks.contains_key(&key)
    }

    pub fn cached_blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Blocks pinned by running requests: the engine's load.
    pub fn active_blocks(&self) -> usize {
        self.blocks.len() - self.free.len()
    }

    /// Release the blocks of every request that ended by `now_ms`, in the order they ended.
    pub fn advance(&mut self, now_ms: u64) {
        while let Some(entry) = self.running.first_entry() {
            if entry.key().0 > now_ms {
                break;
            }
            let done = entry.remove();
            for key in done.iter().rev() {
                let e = self.blocks.get_mut(key).expect("a pinned block is cached");
                e.refs -= 1;
                if e.refs == 0 {
                    e.freed_at = self.next_free;
                    self.free.insert(self.next_free, *key);
                    self.next_free += 1;
                }
            }
        }
    }

    /// Admit `prompt` at `now_ms` for `duration_ms` (after [`Engine::advance`] to `now_ms`).
    pub fn admit(&mut self, prompt: &Prompt, now_ms: u64, duration_ms: u64) -> Admission {
        let keys = &prompt.keys;
        let hit = self.cached_prefix(keys);
        for key in &keys[..hit] {
            let e = self.blocks.get_mut(key).expect("cached");
            if e.refs == 0 {
                self.free.remove(&e.freed_at);
            }
            e.refs += 1;
        }
        let mut events = Vec::new();
        let mut stored = hit;
        while stored < keys.len() {
            // A later block already cached would make the stored run skip a block; it cannot
            // happen while the cache is prefix-closed, and stopping keeps the events consistent.
            if self.blocks.contains_key(&keys[stored]) {
                break;
            }
            if self.blocks.len() >= self.capacity {
                let Some((_, victim)) = self.free.pop_first() else {
                    break;
                };
                self.blocks.remove(&victim);
                events.push(Event::Removed(victim));
            }
            self.blocks.insert(
                keys[stored],
                Entry {
                    refs: 1,
                    freed_at: 0,
                },
            );
            stored += 1;
        }
        if stored > hit {
            events.push(Event::Stored {
                parent: hit.checked_sub(1).map(|p| keys[p]),
                first: hit,
                keys: keys[hit..stored].to_vec(),
            });
        }
        let end = now_ms + duration_ms;
        (self.running).insert((end, self.admitted), keys[..stored].to_vec());
        self.admitted += 1;
        Admission {
            hit_blocks: hit,
            uncached_blocks: keys.len() - stored,
            events,
        }
    }
}

/// N engines; engine `i` is instance `e{i}`, DP rank 0.
pub struct Fleet {
    pub engines: Vec<Engine>,
    /// Engines holding each cached block: the distinct blocks of the whole fleet, which an exact
    /// index counts as its context's blocks.
    holders: HashMap<u64, u32>,
}

impl Fleet {
    pub fn new(engines: usize, capacity: usize) -> Fleet {
        Fleet {
            engines: (0..engines).map(|_| Engine::new(capacity)).collect(),
            holders: HashMap::new(),
        }
    }

    /// Admit `prompt` on engine `e` (see [`Engine::admit`]).
    pub fn admit(&mut self, e: usize, prompt: &Prompt, now_ms: u64, duration_ms: u64) -> Admission {
        let a = self.engines[e].admit(prompt, now_ms, duration_ms);
        for event in &a.events {
            match event {
                Event::Removed(key) => {
                    let n = self
                        .holders
                        .get_mut(key)
                        .expect("an evicted block was held");
                    *n -= 1;
                    if *n == 0 {
                        self.holders.remove(key);
                    }
                }
                Event::Stored { keys, .. } => {
                    keys.iter()
                        .for_each(|k| *self.holders.entry(*k).or_default() += 1);
                }
            }
        }
        a
    }

    /// Distinct blocks cached anywhere in the fleet.
    pub fn distinct_blocks(&self) -> usize {
        self.holders.len()
    }

    pub fn instance(i: usize) -> String {
        format!("e{i}")
    }

    /// Release what every engine's finished requests held by `now_ms`.
    pub fn advance(&mut self, now_ms: u64) {
        self.engines.iter_mut().for_each(|e| e.advance(now_ms));
    }

    /// The true longest cached prefix of `keys` on every engine, in blocks.
    pub fn truth(&self, keys: &[u64]) -> Vec<usize> {
        self.engines.iter().map(|e| e.cached_prefix(keys)).collect()
    }

    /// What the router weighs besides the prefix: per engine (active blocks, running requests).
    pub fn load(&self) -> Vec<(usize, usize)> {
        (self.engines.iter())
            .map(|e| (e.active_blocks(), e.running()))
            .collect()
    }
}

/// How a request's engine is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The least work: the prompt blocks the engine has to compute (those past the cached prefix
    /// the index reports) plus the blocks its running requests pin; ties: fewest running
    /// requests, then the lowest engine number. (The longest prefix alone sends every request
    /// to the first engine that cached the trace's common system prompt.)
    KvAware,
    RoundRobin,
    /// Uniform over the engines, from a fixed seed.
    Random,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::KvAware => "kv-aware",
            Policy::RoundRobin => "round-robin",
            Policy::Random => "random",
        }
    }
}

pub struct Router {
    policy: Policy,
    next: usize,
    rng: Rng,
}

impl Router {
    pub fn new(policy: Policy) -> Router {
        Router {
            policy,
            next: 0,
            rng: Rng(0x7ace),
        }
    }

    /// The engine for a request of `blocks` complete blocks, given each engine's matched prefix
    /// (blocks, as an index answered) and load ([`Fleet::load`]).
    pub fn choose(&mut self, blocks: usize, matched: &[usize], load: &[(usize, usize)]) -> usize {
        let n = matched.len();
        match self.policy {
            Policy::KvAware => (0..n)
                .min_by_key(|&i| {
                    let (active, running) = load[i];
                    (blocks.saturating_sub(matched[i]) + active, running, i)
                })
                .expect("engines"),
            Policy::RoundRobin => {
                self.next += 1;
                (self.next - 1) % n
            }
            Policy::Random => self.rng.below(n),
        }
    }
}

/// Prefix-cache hit rate: cached prompt tokens over prompt tokens.
#[derive(Debug, Clone, Copy, Default)]
pub struct HitRate {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

impl HitRate {
    pub fn add(&mut self, request: &Request, hit_blocks: usize) {
        self.prompt_tokens += request.input_length as u64;
        self.cached_tokens += (hit_blocks * BLOCK_SIZE) as u64;
    }

    pub fn rate(&self) -> f64 {
        self.cached_tokens as f64 / self.prompt_tokens.max(1) as f64
    }
}

/// Replay `requests` without a service: routed by `policy`, the kv-aware router on the true
/// prefixes (what an exact, up-to-date index answers). The hit rate and the events published.
/// `prompts` keeps the keys it hashes for later replays.
pub fn offline(
    requests: &[Request],
    prompts: &mut super::Prompts,
    engines: usize,
    capacity: usize,
    policy: Policy,
) -> (HitRate, EventCounts) {
    let mut fleet = Fleet::new(engines, capacity);
    let mut router = Router::new(policy);
    let (mut hits, mut counts) = (HitRate::default(), EventCounts::default());
    for r in requests {
        fleet.advance(r.arrival_ms);
        let prompt = prompts.prompt(r);
        let matched = match policy {
            Policy::KvAware => fleet.truth(&prompt.keys),
            _ => vec![0; engines],
        };
        let e = router.choose(prompt.keys.len(), &matched, &fleet.load());
        let a = fleet.admit(e, &prompt, r.arrival_ms, r.duration_ms());
        hits.add(r, a.hit_blocks);
        counts.add(&a);
    }
    (hits, counts)
}

/// Events and blocks the engines published.
#[derive(Debug, Clone, Copy, Default)]
pub struct EventCounts {
    pub batches: u64,
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    pub uncached_blocks: u64,
}

impl EventCounts {
    pub fn add(&mut self, a: &Admission) {
        self.batches += u64::from(!a.events.is_empty());
        self.uncached_blocks += a.uncached_blocks as u64;
        for e in &a.events {
            match e {
                Event::Removed(_) => self.removed_blocks += 1,
                Event::Stored { keys, .. } => self.stored_blocks += keys.len() as u64,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(keys: &[u64]) -> Prompt {
        Prompt {
            tokens: vec![0; keys.len() * BLOCK_SIZE],
            keys: keys.to_vec(),
        }
    }

    #[test]
    fn a_full_pool_evicts_the_least_recently_freed_deepest_block_first() {
        let mut e = Engine::new(4);
        let a = e.admit(&prompt(&[1, 2, 3]), 0, 10);
        assert_eq!(
            a.events,
            vec![Event::Stored {
                parent: None,
                first: 0,
                keys: vec![1, 2, 3]
            }]
        );
        e.advance(10);
        // 1, 2 are hits; 5 and 6 need two slots: one empty, then 3 (freed first) is evicted.
        let b = e.admit(&prompt(&[1, 2, 5, 6]), 10, 10);
        assert_eq!(b.hit_blocks, 2);
        assert_eq!(
            b.events,
            vec![
                Event::Removed(3),
                Event::Stored {
                    parent: Some(2),
                    first: 2,
                    keys: vec![5, 6]
                }
            ]
        );
        // Everything is pinned: a new prompt is computed but not cached.
        let c = e.admit(&prompt(&[7]), 11, 10);
        assert_eq!((c.uncached_blocks, c.events.len()), (1, 0));
        assert_eq!(e.cached_prefix(&[1, 2, 5, 6]), 4);
        assert_eq!(e.cached_prefix(&[1, 2, 3]), 2);
    }

    #[test]
    fn memoized_prompt_keys_are_the_engine_chain() {
        use mooncake_conductor::hashing::PrefixKeys;
        let requests = super::super::Trace::read(&super::super::trace_path(), Some(40));
        let mut prompts = super::super::Prompts::new();
        let hasher = super::super::profile().hasher("", "");
        for r in requests.iter().step_by(7) {
            let p = prompts.prompt(r);
            assert_eq!(p.tokens.len(), r.input_length);
            let mut chain = hasher.chain(BLOCK_SIZE as u32, &p.tokens);
            let keys: Vec<u64> = (0..chain.num_blocks()).map(|i| chain.key(i).0).collect();
            assert_eq!(p.keys, keys);
        }
    }
}
