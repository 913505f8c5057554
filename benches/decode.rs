//! Decode throughput of a recorded vLLM 0.33 batch (32 `BlockStored` × 16 blocks of 16 tokens
//! with token ids, then a run of 64 single-hash `BlockRemoved`, as vLLM's block pool emits them),
//! in blocks per second. The payload is the frame of `tests/fixtures/events/vllm_bench_batch.jsonl`, encoded by
//! vLLM's own classes. End-to-end ingest aims at 2 M blocks/s, so decoding must be far above it.

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mooncake_conductor::events::KvEvent;
use mooncake_conductor::fixture::format::Fixture;
use mooncake_conductor::hashing::IndexProjection;
use mooncake_conductor::model::PublisherType;
use mooncake_conductor::wire::decode;

const FIXTURE: &str = include_str!("../tests/fixtures/events/vllm_bench_batch.jsonl");

fn payload() -> Vec<u8> {
    let path = std::path::Path::new("vllm_bench_batch.jsonl");
    let fixture = Fixture::read(FIXTURE.as_bytes(), path).expect("the fixture reads");
    fixture.frames[0].payload.to_vec()
}

fn blocks_in(payload: &[u8]) -> u64 {
    let batch =
        decode(PublisherType::Vllm, payload, IndexProjection::Low64Be).expect("fixture decodes");
    assert!(batch.invalid.is_empty() && batch.ignored.is_empty());
    batch
        .events
        .iter()
        .map(|e| match e {
            KvEvent::Stored(s) => s.hashes.len() as u64,
            KvEvent::Removed(r) => r.hashes.len() as u64,
            _ => 0,
        })
        .sum()
}

fn bench_decode(c: &mut Criterion) {
    let payload = payload();
    let blocks = blocks_in(&payload);
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(blocks));
    group.bench_function("vllm_0.33_map_batch", |b| {
        b.iter(|| {
            decode(
                PublisherType::Vllm,
                black_box(&payload),
                IndexProjection::Low64Be,
            )
        })
    });
    group.finish();

    // A plain summary line, independent of criterion's output format.
    let rounds = 20_000u32;
    let start = Instant::now();
    for _ in 0..rounds {
        black_box(
            decode(
                PublisherType::Vllm,
                black_box(&payload),
                IndexProjection::Low64Be,
            )
            .ok(),
        );
    }
    let secs = start.elapsed().as_secs_f64();
    let per_sec = f64::from(rounds) * blocks as f64 / secs;
    println!(
        "decode summary: {} bytes, {blocks} blocks per batch, {:.1} us/batch, {:.1} M blocks/s",
        payload.len(),
        secs * 1e6 / f64::from(rounds),
        per_sec / 1e6
    );
}

criterion_group!(benches, bench_decode);
criterion_main!(benches);
