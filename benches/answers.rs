//! What the transports spend on one query besides the index: decoding a 2048-token request and
//! encoding an answer of 32 instances x 2 ranks (the load tool's scenario), per wire format,
//! next to the generic encoders they replace. Each pair must produce the same bytes (the unit
//! tests of `gateway::grpc_wire` and `gateway::http_body` check that). The `client_` cases are
//! what a router pays on its side: part of every latency the load tool reports.

use std::hint::black_box;

use bytes::{Buf, BytesMut};
use criterion::{Criterion, criterion_group, criterion_main};
use mooncake_conductor::gateway::grpc_wire::{QueryReply, QueryRequestIn};
use mooncake_conductor::gateway::http_body::{HitsBody, hits_msgpack};
use mooncake_conductor::gateway::pb;
use mooncake_conductor::index::{FlatAnswer, InstanceHits, QueryHits, SortedMap, TierCounts};
use prost::Message;

/// The load tool's answer: instance `i` holds a prefix growing with `i` on rank 0's GPU, half
/// of it on rank 1's CPU.
fn answer() -> QueryHits {
    let mut hits = QueryHits::default();
    for i in 0..32u64 {
        let (gpu, cpu) = (64 * (i + 1), 32 * (i + 1));
        let t = |device, cpu_local| TierCounts {
            device,
            cpu_local,
            cpu_share: cpu_local,
            disk: cpu_local,
        };
        let row = InstanceHits {
            longest_matched: gpu,
            dp: SortedMap::from_iter([(0, gpu), (1, 0)]),
            rank_matches: SortedMap::from_iter([(0, t(gpu, gpu)), (1, t(0, cpu))]),
            device: gpu,
            cpu_local: gpu,
            cpu_share: gpu,
            disk: gpu,
        };
        hits.hits.insert(format!("inst-{i}"), row);
    }
    hits
}

/// The generated message as the service built it before `QueryReply`.
fn generated(hits: QueryHits) -> pb::QueryResponse {
    let tiers = |t: &TierCounts| pb::TierCounts {
        device: t.device as i64,
        cpu_local: t.cpu_local as i64,
        cpu_share: t.cpu_share as i64,
        disk: t.disk as i64,
    };
    let rows = hits.hits.into_iter().map(|(id, h)| {
        let row = pb::InstanceHits {
            longest_matched: h.longest_matched as i64,
            dp: (h.dp.iter())
                .map(|(r, v)| (r.to_string(), *v as i64))
                .collect(),
            rank_matches: (h.rank_matches.iter())
                .map(|(r, t)| (r.to_string(), tiers(t)))
                .collect(),
            device: h.device as i64,
            cpu_local: h.cpu_local as i64,
            cpu_share: h.cpu_share as i64,
            disk: h.disk as i64,
        };
        (id, row)
    });
    pb::QueryResponse {
        ret: 0,
        error: None,
        hits: rows.collect(),
        loads: Default::default(),
        status: Default::default(),
    }
}

fn bench_answers(c: &mut Criterion) {
    let hits = answer();
    // The walk lends the transports its answer in this layout (`AnswerView`).
    let flat = FlatAnswer::from_hits(&hits);
    let mut g = c.benchmark_group("answer_32x2");
    // The generated message takes its own copy of the answer, as a handler owning it would.
    g.bench_function("grpc_generated_message", |b| {
        b.iter(|| generated(black_box(&hits).clone()).encode_to_vec())
    });
    g.bench_function("grpc_query_reply", |b| {
        b.iter(|| QueryReply::answer(black_box(&flat).view()).encode_to_vec())
    });
    g.bench_function("msgpack_rmp_serde", |b| {
        b.iter(|| rmp_serde::to_vec_named(&HitsBody(black_box(&flat).view())).unwrap())
    });
    g.bench_function("msgpack_hand_written", |b| {
        b.iter(|| hits_msgpack(black_box(&flat).view()))
    });
    g.bench_function("json_serde", |b| {
        b.iter(|| serde_json::to_vec(&HitsBody(black_box(&flat).view())).unwrap())
    });
    // What a client then spends on the answer: the generated types, or a msgpack value tree.
    let grpc_bytes = QueryReply::answer(flat.view()).encode_to_vec();
    g.bench_function("grpc_client_decode_generated", |b| {
        b.iter(|| pb::QueryResponse::decode(black_box(&grpc_bytes[..])).unwrap())
    });
    let msgpack_bytes = hits_msgpack(flat.view());
    g.bench_function("msgpack_client_decode_rmpv", |b| {
        b.iter(|| rmpv::decode::read_value(&mut black_box(&msgpack_bytes[..])).unwrap())
    });
    g.finish();
}

fn bench_requests(c: &mut Criterion) {
    let request = pb::QueryRequest {
        model_name: "load-model".into(),
        block_size: 16,
        token_ids: (0..2048).map(|i| (i * 7919 + 17) % 32000).collect(),
        ..Default::default()
    };
    let bytes = BytesMut::from(&request.encode_to_vec()[..]);
    let mut g = c.benchmark_group("request_2048_tokens");
    g.bench_function("grpc_client_encode_generated", |b| {
        b.iter(|| black_box(&request).clone().encode_to_vec())
    });
    // tonic hands the decoder a length-limited view of its receive buffer, as `take` does.
    g.bench_function("grpc_generated_decode", |b| {
        b.iter(|| {
            let buf = black_box(&bytes).clone();
            pb::QueryRequest::decode(buf.take(bytes.len())).unwrap()
        })
    });
    g.bench_function("grpc_fast_path_decode", |b| {
        b.iter(|| {
            let buf = black_box(&bytes).clone();
            QueryRequestIn::decode(buf.take(bytes.len())).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench_answers, bench_requests);
criterion_main!(benches);
