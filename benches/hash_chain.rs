//! Hash chain cost per block for every strategy/algorithm, at block sizes 16 and 128 over a
//! 32k-token prompt. Criterion reports time per chain with a throughput in blocks, so the
//! per-block cost is the reciprocal of "elem/s"; a summary line with ns/block is printed too.
//! The index's own derived keys (`hashing::derived`), which a query from tokens walks, are
//! measured beside the engines' recipes.

use std::hint::black_box;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mooncake_conductor::hashing::derived::{BlockRule, DerivedChain};
use mooncake_conductor::hashing::{HashProfile, PrefixKeys};

const PROMPT_TOKENS: usize = 32 * 1024;

fn profiles() -> Vec<(&'static str, HashProfile)> {
    let vllm = |alg| HashProfile::resolve(Some("vllm_v1"), Some(alg), Some("0"), Some("low64_be"));
    let sglang = |s| HashProfile::resolve(Some(s), Some("sha256_raw"), None, Some("first64_be"));
    [
        ("vllm_v1+sha256_cbor", vllm("sha256_cbor")),
        ("vllm_v1+sha256", vllm("sha256")),
        ("sglang+sha256_raw", sglang("sglang")),
        ("sglang_bigram+sha256_raw", sglang("sglang_bigram")),
    ]
    .into_iter()
    .map(|(name, p)| (name, p.expect("benchmark profiles are valid")))
    .collect()
}

/// Token ids spread like a real vocabulary (mostly 3- and 5-byte CBOR ints).
fn prompt() -> Vec<i32> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..PROMPT_TOKENS)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % 151_936) as i32
        })
        .collect()
}

fn walk_all(hasher: &mooncake_conductor::hashing::BlockHasher, bs: u32, tokens: &[i32]) -> u64 {
    let mut chain = hasher.chain(bs, tokens);
    let mut acc = 0u64;
    for i in 0..chain.num_blocks() {
        acc ^= chain.key(i).0;
    }
    acc
}

fn bench_chains(c: &mut Criterion) {
    report_sha_backend();
    let tokens = prompt();
    let mut group = c.benchmark_group("hash_chain");
    let mut summary = Vec::new();
    for (name, profile) in profiles() {
        let hasher = profile.hasher("", "");
        for bs in [16u32, 128] {
            let blocks = hasher.num_blocks(bs, tokens.len()) as u64;
            group.throughput(Throughput::Elements(blocks));
            group.bench_with_input(BenchmarkId::new(name, format!("bs{bs}")), &bs, |b, &bs| {
                b.iter(|| walk_all(&hasher, bs, black_box(&tokens)))
            });
            // The summary takes the fastest of many rounds: on a shared machine the minimum
            // is the cost without preemption, which criterion's mean does not separate.
            let ns = min_ns(40, || walk_all(&hasher, bs, black_box(&tokens))) / blocks as f64;
            summary.push(format!(
                "{name:<26} bs {bs:>3}: {ns:>7.1} ns/block ({blocks} blocks)"
            ));
        }
    }
    for (name, rule) in [
        ("derived full blocks", BlockRule::FullBlocks),
        ("derived partial final", BlockRule::PartialFinal),
        ("derived bigram", BlockRule::Bigram),
    ] {
        for bs in [16u32, 128] {
            let blocks = rule.num_blocks(bs, tokens.len()) as u64;
            let walk = || {
                let mut chain = DerivedChain::new(rule, bs, black_box(&tokens), "");
                (0..chain.num_blocks()).fold(0u64, |acc, i| acc ^ chain.key(i).0)
            };
            group.throughput(Throughput::Elements(blocks));
            group.bench_function(BenchmarkId::new(name, format!("bs{bs}")), |b| b.iter(walk));
            let ns = min_ns(40, walk) / blocks as f64;
            summary.push(format!(
                "{name:<26} bs {bs:>3}: {ns:>7.1} ns/block ({blocks} blocks)"
            ));
        }
    }
    group.finish();
    println!("\nper-block summary ({PROMPT_TOKENS}-token prompt):");
    for line in summary {
        println!("  {line}");
    }
}

/// The fastest of `rounds` timed calls, in nanoseconds.
fn min_ns<R>(rounds: u32, mut f: impl FnMut() -> R) -> f64 {
    (0..rounds)
        .map(|_| {
            let start = Instant::now();
            black_box(f());
            start.elapsed().as_nanos() as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// sha2 picks SHA-NI at run time; report whether the CPU offers it and what a 64-byte compression
/// costs (a few tens of ns with SHA-NI, several times that in software). Every block costs at
/// least its compressions: a 16-token CBOR block is 2 (65..=119 bytes), a 128-token one about 9.
fn report_sha_backend() {
    #[cfg(target_arch = "x86_64")]
    let shani =
        std::arch::is_x86_feature_detected!("sha") && std::arch::is_x86_feature_detected!("sse4.1");
    #[cfg(not(target_arch = "x86_64"))]
    let shani = false;
    let mut state = [0u32; 8];
    let blocks = [[0x5au8; 64]; 1000];
    let ns = min_ns(200, || {
        sha2::block_api::compress256(black_box(&mut state), black_box(&blocks));
    }) / 1000.0;
    println!(
        "sha-ni available: {shani}; one SHA-256 compression: {ns:.1} ns (fastest of 200 runs)"
    );
}

criterion_group!(benches, bench_chains);
criterion_main!(benches);
