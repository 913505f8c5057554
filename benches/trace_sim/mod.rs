//! A fleet simulator driven by Mooncake's conversation trace (`benches/traces/`), shared by the
//! exactness test (`tests/it/trace_replay.rs`) and the load tool's `--mode trace`; both include
//! this folder with `#[path]`, so there is one copy of it.
//!
//! - [`Trace`] reads the requests; [`Prompts`] turns a request into its prompt: 512 deterministic
//!   token ids per hash id, cut at `input_length`, and the vLLM block keys of its complete
//!   16-token blocks (`vllm_v1`, `sha256_cbor`, seed "0", `low64_be`: what the engines in the
//!   simulation publish and what the service is registered with).
//! - [`fleet::Fleet`] holds N engines, each a vLLM-like block pool, and is the ground truth: which
//!   blocks each engine holds, so the true longest cached prefix of any prompt is known. Admitting
//!   a request yields the events the engine publishes.
//! - [`fleet::Router`] picks an engine per request: KV-aware (the least work, from the cached
//!   prefix an index reports and the engine's load), round-robin, or seeded random.
#![allow(dead_code)] // the test and the load tool each use part of it

pub mod fleet;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mooncake_conductor::hashing::{BlockHasher, HashProfile};
use mooncake_conductor::test_rng::mix64;

/// Tokens one trace hash id stands for.
pub const HASH_ID_TOKENS: usize = 512;
/// The engines' block size (vLLM's default).
pub const BLOCK_SIZE: usize = 16;
/// Blocks per hash id: 512 / 16, so hash ids and blocks line up.
pub const BLOCKS_PER_ID: usize = HASH_ID_TOKENS / BLOCK_SIZE;
/// Token ids are drawn below this (a vocabulary of Qwen's or Llama 3's size).
const VOCABULARY: u64 = 128_000;

/// One request of the trace.
#[derive(Debug, Clone)]
pub struct Request {
    /// Arrival, in ms from the start of the trace.
    pub arrival_ms: u64,
    pub input_length: usize,
    pub output_length: usize,
    pub hash_ids: Vec<u64>,
}

impl Request {
    /// How long the request keeps its blocks pinned: a deterministic stand-in for prefill and
    /// decode (1 ms per 20 prompt tokens plus 20 ms per output token), at least 100 ms.
    pub fn duration_ms(&self) -> u64 {
        (self.input_length as u64 / 20 + 20 * self.output_length as u64).max(100)
    }
}

/// The trace file kept in the repository.
pub fn trace_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/traces/conversation_trace.jsonl")
}

pub struct Trace;

impl Trace {
    /// The first `limit` requests of the trace at `path` (all of them when `limit` is `None`).
    pub fn read(path: &Path, limit: Option<usize>) -> Vec<Request> {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read the trace {}: {e}", path.display()));
        let lines = text.lines().filter(|l| !l.trim().is_empty());
        lines
            .take(limit.unwrap_or(usize::MAX))
            .enumerate()
            .map(|(n, line)| {
                let v: serde_json::Value = serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("trace line {}: {e}", n + 1));
                let num = |k: &str| {
                    v[k].as_u64()
                        .unwrap_or_else(|| panic!("trace line {}: no {k}", n + 1))
                };
                let hash_ids: Vec<u64> = (v["hash_ids"].as_array().into_iter().flatten())
                    .map(|h| h.as_u64().expect("hash id"))
                    .collect();
                let input_length = num("input_length") as usize;
                // The replay cuts the ids' tokens at the input length; a request asking for more
                // tokens than its ids stand for would have no prompt to cut.
                assert!(
                    input_length <= hash_ids.len() * HASH_ID_TOKENS,
                    "trace line {}: {input_length} tokens, {} hash ids",
                    n + 1,
                    hash_ids.len()
                );
                Request {
                    arrival_ms: num("timestamp"),
                    input_length,
                    output_length: num("output_length") as usize,
                    hash_ids,
                }
            })
            .collect()
    }
}

/// The 512 token ids of hash id `id`: seeded from the id, so every request sharing the id
/// shares its tokens.
pub fn id_tokens(id: u64) -> impl Iterator<Item = i32> {
    (0..HASH_ID_TOKENS as u64)
        .map(move |i| (mix64(id.wrapping_mul(1 << 10) ^ i) % VOCABULARY) as i32)
}

/// A request's prompt: its token ids and the keys of its complete blocks.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub tokens: Vec<i32>,
    pub keys: Vec<u64>,
}

impl Prompt {
    /// The tokens of blocks `from..from + n`.
    pub fn block_tokens(&self, from: usize, n: usize) -> &[i32] {
        &self.tokens[from * BLOCK_SIZE..(from + n) * BLOCK_SIZE]
    }
}

/// One hash id at one place of a chain: its 32 block keys and the digest the next id's first
/// block continues from.
struct Node {
    keys: [u64; BLOCKS_PER_ID],
    digest: [u8; 32],
}

/// Prompts of trace requests. Keys are hashed once per distinct chain of hash ids (a trie keyed
/// by (parent node, hash id)): most requests share their first ids, and hashing every prompt in
/// full would cost more than the rest of the replay.
pub struct Prompts {
    hasher: BlockHasher,
    /// (parent node + 1, or 0 at the root; hash id) -> node.
    children: HashMap<(u32, u64), u32>,
    nodes: Vec<Node>,
    scratch: Vec<u8>,
}

impl Default for Prompts {
    fn default() -> Self {
        Prompts::new()
    }
}

impl Prompts {
    pub fn new() -> Prompts {
        Prompts {
            hasher: profile().hasher("", ""),
            children: HashMap::new(),
            nodes: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// The prompt of `request`.
    pub fn prompt(&mut self, request: &Request) -> Prompt {
        let mut tokens = Vec::with_capacity(request.hash_ids.len() * HASH_ID_TOKENS);
        for &id in &request.hash_ids {
            tokens.extend(id_tokens(id));
        }
        tokens.truncate(request.input_length);
        let blocks = tokens.len() / BLOCK_SIZE;
        let mut keys = Vec::with_capacity(blocks);
        let mut parent = 0u32;
        for &id in &request.hash_ids {
            if keys.len() == blocks {
                break;
            }
            let node = self.node(parent, id);
            let n = (blocks - keys.len()).min(BLOCKS_PER_ID);
            keys.extend_from_slice(&self.nodes[node as usize].keys[..n]);
            parent = node + 1;
        }
        Prompt { tokens, keys }
    }

    /// The node of hash id `id` after `parent`, hashed on first use from the id's whole 512
    /// tokens (a prompt cut inside the id takes the first keys only: vLLM hashes complete blocks,
    /// each from its parent, so a cut changes no earlier key).
    fn node(&mut self, parent: u32, id: u64) -> u32 {
        if let Some(&node) = self.children.get(&(parent, id)) {
            return node;
        }
        let own: Vec<i32> = id_tokens(id).collect();
        let mut digest = match parent {
            0 => None,
            p => Some(self.nodes[p as usize - 1].digest),
        };
        let mut keys = [0u64; BLOCKS_PER_ID];
        for (b, key) in keys.iter_mut().enumerate() {
            let block = &own[b * BLOCK_SIZE..(b + 1) * BLOCK_SIZE];
            let step = self.hasher.step(digest.as_ref(), block, &mut self.scratch);
            *key = step.key.0;
            digest = Some(step.digest);
        }
        let node = self.nodes.len() as u32;
        self.nodes.push(Node {
            keys,
            digest: digest.expect("an id has blocks"),
        });
        self.children.insert((parent, id), node);
        node
    }
}

/// The hash profile the simulated engines hash with and the service is registered with.
pub fn profile() -> HashProfile {
    mooncake_conductor::hashing::profile::vllm_cbor_default()
}

/// The same profile as registration fields.
pub const PROFILE: [(&str, &str); 4] = [
    ("strategy", "vllm_v1"),
    ("algorithm", "sha256_cbor"),
    ("python_hash_seed", "0"),
    ("index_projection", "low64_be"),
];

/// Percentile `p` (0..=1, nearest rank) of sorted `values`; 0 when empty.
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let n = sorted.len();
    sorted[((p * n as f64).ceil() as usize).clamp(1, n) - 1]
}
