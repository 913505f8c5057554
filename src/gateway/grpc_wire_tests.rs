use std::collections::HashMap;

use prost::Message;
use prost::bytes::Buf;

use super::*;
use crate::index::{InstanceHits, TierCounts};
use crate::test_rng::Rng;
use prost::encoding::{encode_key, encode_varint};

/// The answer as the generated message held it before `QueryReply`: the reference.
fn reference(result: Result<QueryHits, OpError>) -> pb::QueryResponse {
    let tiers = |t: &TierCounts| pb::TierCounts {
        device: t.device as i64,
        cpu_local: t.cpu_local as i64,
        cpu_share: t.cpu_share as i64,
        disk: t.disk as i64,
    };
    let row = |h: &InstanceHits| pb::InstanceHits {
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
    match result {
        Ok(hits) => pb::QueryResponse {
            ret: 0,
            error: None,
            hits: hits
                .hits
                .iter()
                .map(|(id, h)| (id.clone(), row(h)))
                .collect(),
            loads: HashMap::new(),
            status: HashMap::new(),
        },
        Err(e) => pb::QueryResponse {
            ret: e.code.value(),
            error: Some(super::error_detail(&e)),
            hits: HashMap::new(),
            loads: HashMap::new(),
            status: HashMap::new(),
        },
    }
}

/// Counts that exercise every varint length, zero (omitted) and `u64::MAX` (`-1` as int64).
fn count(rng: &mut Rng) -> u64 {
    *rng.pick(&[0, 0, 1, 127, 128, 16_383, 16_384, 1 << 35, u64::MAX])
}

fn tiers(rng: &mut Rng) -> TierCounts {
    TierCounts {
        device: count(rng),
        cpu_local: count(rng),
        cpu_share: count(rng),
        disk: count(rng),
    }
}

/// A row as a walk answers it: `dp` is each rank's `device` count, the row's counts are the
/// maxima over its ranks, and `longest_matched` is `disk`.
fn row(rng: &mut Rng, ranks: usize) -> InstanceHits {
    let mut h = InstanceHits::default();
    for _ in 0..ranks {
        let rank = *rng.pick(&[0, 1, 2, 9, 10, 11, 99, 100, 12_345, u32::MAX]);
        let t = tiers(rng);
        h.dp.insert(rank, t.device);
        h.rank_matches.insert(rank, t);
    }
    for t in h.rank_matches.values() {
        h.device = h.device.max(t.device);
        h.cpu_local = h.cpu_local.max(t.cpu_local);
        h.cpu_share = h.cpu_share.max(t.cpu_share);
        h.disk = h.disk.max(t.disk);
    }
    h.longest_matched = h.disk;
    h
}

fn encoded(reply: &QueryReply) -> Vec<u8> {
    let bytes = reply.encode_to_vec();
    assert_eq!(bytes.len(), reply.encoded_len());
    bytes
}

#[test]
fn one_row_answers_are_byte_identical_to_the_generated_message() {
    // One instance with at most one rank: every map has one order, so bytes must match exactly.
    let mut rng = Rng(0x5eed_0001);
    for case in 0..2000 {
        let mut hits = QueryHits::default();
        let id = rng
            .pick(&["inst-0", "", "a-much-longer-instance-name"])
            .to_string();
        let ranks = rng.below(2);
        hits.hits.insert(id, row(&mut rng, ranks));
        let expected = reference(Ok(hits.clone())).encode_to_vec();
        assert_eq!(encoded(&QueryReply::new(Ok(hits))), expected, "case {case}");
    }
}

#[test]
fn default_rows_and_entries_are_omitted_as_prost_omits_them() {
    let mut hits = QueryHits::default();
    hits.hits.insert("zero".into(), InstanceHits::default());
    let mut zero_ranks = InstanceHits::default();
    zero_ranks.dp.insert(3, 0);
    zero_ranks.rank_matches.insert(3, TierCounts::default());
    hits.hits.insert("zero-ranks".into(), zero_ranks);
    hits.hits.insert(String::new(), InstanceHits::default());
    for (id, row) in &hits.hits {
        let one = QueryHits {
            hits: [(id.clone(), row.clone())].into_iter().collect(),
            ..QueryHits::default()
        };
        let expected = reference(Ok(one.clone())).encode_to_vec();
        assert_eq!(encoded(&QueryReply::new(Ok(one))), expected, "{id:?}");
    }
    let bytes = encoded(&QueryReply::new(Ok(hits.clone())));
    assert_eq!(
        pb::QueryResponse::decode(&bytes[..]).unwrap(),
        reference(Ok(hits))
    );
}

#[test]
fn many_row_answers_decode_to_the_generated_message() {
    let mut rng = Rng(0x5eed_0002);
    for case in 0..300 {
        let mut hits = QueryHits::default();
        for i in 0..rng.below(40) {
            let ranks = rng.below(12);
            hits.hits.insert(format!("inst-{i}"), row(&mut rng, ranks));
        }
        assert_encodes_as_prost(hits, case);
    }
}

#[test]
fn failed_queries_encode_their_code_and_detail() {
    for e in [
        OpError::invalid("block_size", "out_of_range", "block_size must be positive"),
        OpError::unavailable("registry unavailable"),
        OpError::internal("boom"),
    ] {
        let expected = reference(Err(e.clone())).encode_to_vec();
        assert_eq!(encoded(&QueryReply::new(Err(e))), expected);
    }
    assert!(encoded(&QueryReply::new(Ok(QueryHits::default()))).is_empty());
}

/// A buffer delivered in two chunks split at `at`, as a message spread over two frames is.
fn split(bytes: &[u8], at: usize) -> impl Buf + '_ {
    let (a, b) = bytes.split_at(at);
    a.chain(b)
}

fn token_cases() -> Vec<Vec<i32>> {
    let mut rng = Rng(0x5eed_0003);
    let mut cases = vec![
        vec![],
        vec![0],
        vec![-1, i32::MIN, i32::MAX, 127, 128, 16_384],
    ];
    cases.push((0..2048).map(|i| (i * 7919 + 17) % 32000).collect());
    cases.push((0..300).map(|_| rng.next() as i32).collect());
    cases
}

#[test]
fn query_requests_decode_as_prost_decodes_them() {
    for tokens in token_cases() {
        let request = pb::QueryRequest {
            model_name: "m".into(),
            lora_name: "l".into(),
            block_size: 16,
            tenant_id: "t".into(),
            token_ids: tokens,
            cache_salt: "s".into(),
            instance_filter: "i".into(),
            include_load: true,
            include_status: false,
        };
        let bytes = request.encode_to_vec();
        assert_eq!(QueryRequestIn::decode(&bytes[..]).unwrap().0, request);
        // Split chunks take prost's path wherever the field is cut.
        for at in [0, 1, bytes.len() / 2, bytes.len().saturating_sub(1)] {
            let decoded = QueryRequestIn::decode(split(&bytes, at)).unwrap().0;
            assert_eq!(decoded, request, "split at {at}");
        }
    }
}

#[test]
fn hash_requests_decode_as_prost_decodes_them() {
    let mut rng = Rng(0x5eed_0004);
    let mut cases = vec![vec![], vec![0, 1, u64::MAX, 1 << 63, 127, 128]];
    cases.push((0..500).map(|_| rng.next()).collect());
    for hashes in cases {
        let request = pb::QueryByHashRequest {
            model_name: "m".into(),
            block_size: 16,
            block_hashes: hashes,
            ..Default::default()
        };
        let bytes = request.encode_to_vec();
        assert_eq!(QueryByHashRequestIn::decode(&bytes[..]).unwrap().0, request);
        let at = bytes.len() / 2;
        assert_eq!(
            QueryByHashRequestIn::decode(split(&bytes, at)).unwrap().0,
            request
        );
    }
}

#[test]
fn unpacked_and_repeated_token_fields_append_like_prost() {
    // Proto3 parsers accept unpacked repeated scalars, and repeated fields concatenate.
    let mut bytes = Vec::new();
    for t in [5i32, -7] {
        encode_key(TOKEN_IDS, WireType::Varint, &mut bytes);
        encode_varint(t as u64, &mut bytes);
    }
    let packed = pb::QueryRequest {
        token_ids: vec![1, 2, 3],
        ..Default::default()
    };
    packed.encode_raw(&mut bytes);
    packed.encode_raw(&mut bytes);
    let expected = pb::QueryRequest::decode(&bytes[..]).unwrap();
    assert_eq!(expected.token_ids, [5, -7, 1, 2, 3, 1, 2, 3]);
    assert_eq!(QueryRequestIn::decode(&bytes[..]).unwrap().0, expected);
}

#[test]
fn malformed_packed_fields_fail_with_prosts_error() {
    let request = pb::QueryRequest {
        token_ids: vec![1, 300, -1],
        ..Default::default()
    };
    let good = request.encode_to_vec();
    let mut cases: Vec<Vec<u8>> = (1..good.len()).map(|n| good[..n].to_vec()).collect();
    // An eleven-byte varint inside the packed body, and a length past the end.
    let mut overlong = vec![(TOKEN_IDS << 3 | 2) as u8, 11];
    overlong.extend([0xff; 10]);
    overlong.push(0);
    cases.push(overlong);
    cases.push(vec![(TOKEN_IDS << 3 | 2) as u8, 5, 1]);
    // A varint whose last byte runs past the packed length.
    cases.push(vec![(TOKEN_IDS << 3 | 2) as u8, 1, 0x80, 0x01]);
    for bytes in cases {
        let expected = pb::QueryRequest::decode(&bytes[..]);
        let actual = QueryRequestIn::decode(&bytes[..]).map(|r| r.0);
        match (expected, actual) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{bytes:?}"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{bytes:?}"),
            (a, b) => panic!("{bytes:?}: prost {a:?}, fast path {b:?}"),
        }
    }
}

/// Rows that repeat an earlier row's values are copied from the reply (see `repeated_rows`):
/// with more distinct values than are remembered, every copy must still be the right one.
#[test]
fn answers_with_repeated_rows_decode_to_the_generated_message() {
    let mut rng = Rng(0x5eed_0006);
    for case in 0..200 {
        let distinct: Vec<InstanceHits> = (0..1 + rng.below(7))
            .map(|_| {
                let ranks = rng.below(4);
                row(&mut rng, ranks)
            })
            .collect();
        let mut hits = QueryHits::default();
        for i in 0..rng.below(60) {
            let id = if i == 0 && rng.below(4) == 0 {
                String::new()
            } else {
                format!("inst-{i}")
            };
            hits.hits.insert(id, rng.pick(&distinct).clone());
        }
        assert_encodes_as_prost(hits, case);
    }
}

/// The hand-written reply of `hits` has the bytes prost's generated message has.
fn assert_encodes_as_prost(hits: QueryHits, case: usize) {
    let expected = reference(Ok(hits.clone()));
    let bytes = encoded(&QueryReply::new(Ok(hits)));
    assert_eq!(bytes.len(), expected.encoded_len(), "case {case}");
    assert_eq!(
        pb::QueryResponse::decode(&bytes[..]).unwrap(),
        expected,
        "case {case}"
    );
}
