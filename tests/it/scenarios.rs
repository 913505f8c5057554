//! The recorded engine scenarios (`tests/fixtures/events/scenarios/`, produced by vLLM 0.33's
//! and SGLang 0.5.23's own caches): each one's batches are published with their recorded seqs
//! on a real PUB socket, and every query must get the answer the engine's own cache state gives.

use mooncake_conductor::gateway::pb;
use serde_json::{Value, json};

use crate::e2e_query::{handshake, register_request};
use crate::support::player::Player;
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http};

const INSTANCE: &str = "engine-0";

/// One scenario file: its header line, its batches `(seq, payload)` and its query lines.
struct Scenario {
    header: Value,
    batches: Vec<(u64, Vec<u8>)>,
    queries: Vec<Value>,
}

fn load(name: &str) -> Scenario {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/events/scenarios")
        .join(format!("{name}.jsonl"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let mut scenario = Scenario {
        header: Value::Null,
        batches: Vec::new(),
        queries: Vec::new(),
    };
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).expect("scenario line is JSON");
        match v["kind"].as_str() {
            Some("scenario") => scenario.header = v,
            Some("batch") => scenario.batches.push((
                v["seq"].as_u64().expect("seq"),
                unhex(v["payload_hex"].as_str().expect("payload_hex")),
            )),
            Some("query") => scenario.queries.push(v),
            other => panic!("{name}: unknown line kind {other:?}"),
        }
    }
    assert!(
        scenario.header.is_object() && !scenario.batches.is_empty(),
        "{name}: a header and at least one batch"
    );
    assert!(!scenario.queries.is_empty(), "{name}: nothing to check");
    scenario
}

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

/// The four cumulative counts of a response row, in the manifest's order.
fn counts(t: &pb::TierCounts) -> [i64; 4] {
    [t.device, t.cpu_local, t.cpu_share, t.disk]
}

fn expected(v: &Value) -> [i64; 4] {
    ["device", "cpu_local", "cpu_share", "disk"].map(|k| v[k].as_i64().expect("count"))
}

/// Publish every batch with its recorded seq, then ask every query and compare with the
/// engine-derived expectation. Returns the mismatches, so one report lists them all.
async fn play(name: &str) -> Vec<String> {
    let scenario = load(name);
    let reg = &scenario.header["registration"];
    let server = Server::start().await;
    let first_seq = scenario.batches[0].0;
    let mut player = Player::start(false, first_seq).await;
    let registration = json!({
        "instance_id": INSTANCE, "endpoint": player.endpoint, "replay_endpoint": "",
        "publisher_type": reg["publisher_type"], "model_name": reg["model_name"],
        "lora_name": reg["lora_name"].as_str().unwrap_or(""), "block_size": reg["block_size"],
        "dp_rank": reg["dp_rank"], "hash_profile": reg["hash_profile"],
    });
    let reply = server
        .grpc()
        .await
        .register(register_request(&registration))
        .await
        .expect("register")
        .into_inner();
    assert_eq!(reply.ret, 0, "{name}: {:?}", reply.error);

    let rank = reg["dp_rank"].as_u64().expect("dp_rank");
    let service = format!("{INSTANCE}|default|{rank}");
    let mut batches = scenario.batches.into_iter();
    let (seq, payload) = batches.next().unwrap();
    assert_eq!(player.next_seq(), seq);
    handshake(&server, &mut player, &service, payload).await;
    let mut last = seq;
    for (seq, payload) in batches {
        assert_eq!(
            player.next_seq(),
            seq,
            "{name}: recorded seqs are consecutive"
        );
        player.publish(payload).await;
        last = seq;
    }
    // Applied when the subscription's watermark reaches the last recorded seq.
    let status = eventually(&format!("{name}: batch {last} applied"), WAIT, || async {
        let status = http::get(server.http_port, "/services/status").await.json();
        let row = status["services"]
            .as_array()?
            .iter()
            .find(|s| s["service"] == service.as_str())?
            .clone();
        (row["last_seq"] == json!(last)).then_some(row)
    })
    .await;
    assert_eq!(
        status["invalid_events"].as_u64(),
        Some(0),
        "{name}: every recorded event decodes: {status}"
    );
    // The seq above is what the subscription received and handed on; the context applies it
    // from its mailbox. A registration in the same context answers only after a round trip
    // through that mailbox, so once it answers every recorded batch is applied. The other
    // instance never shows up: the queries filter on ours.
    let mut barrier = registration.clone();
    barrier["instance_id"] = json!("barrier");
    barrier["endpoint"] = json!(format!("tcp://127.0.0.1:{}", crate::support::free_port()));
    let reply = server
        .grpc()
        .await
        .register(register_request(&barrier))
        .await
        .expect("barrier register")
        .into_inner();
    assert_eq!(reply.ret, 0, "{name}: {:?}", reply.error);

    let mut wrong = Vec::new();
    for (i, q) in scenario.queries.iter().enumerate() {
        let request = pb::QueryRequest {
            model_name: text(&reg["model_name"]),
            lora_name: text(&q["lora_name"]),
            block_size: reg["block_size"].as_i64().expect("block_size"),
            token_ids: q["token_ids"]
                .as_array()
                .expect("token_ids")
                .iter()
                .map(|t| t.as_i64().expect("token") as i32)
                .collect(),
            cache_salt: text(&q["cache_salt"]),
            instance_filter: INSTANCE.into(),
            ..Default::default()
        };
        let reply = server
            .grpc()
            .await
            .query(request)
            .await
            .expect("query")
            .into_inner();
        assert_eq!(reply.ret, 0, "{name} query {i}: {:?}", reply.error);
        let want = &q["expect"];
        let Some(row) = reply.hits.get(INSTANCE) else {
            wrong.push(format!(
                "{name} query {i}: no row for {INSTANCE}, want {want}"
            ));
            continue;
        };
        let got = [row.device, row.cpu_local, row.cpu_share, row.disk];
        let mut ranks: Vec<(String, [i64; 4])> = row
            .rank_matches
            .iter()
            .map(|(r, t)| (r.clone(), counts(t)))
            .collect();
        ranks.sort();
        let mut want_ranks: Vec<(String, [i64; 4])> = want["rank_matches"]
            .as_object()
            .expect("rank_matches")
            .iter()
            .map(|(r, t)| (r.clone(), expected(t)))
            .collect();
        want_ranks.sort();
        if got != expected(want) || ranks != want_ranks || row.longest_matched != got[3] {
            wrong.push(format!(
                "{name} query {i} ({}): got {got:?} ranks {ranks:?}, engine says {:?} ranks {want_ranks:?}",
                q["why"].as_str().unwrap_or(""),
                expected(want)
            ));
        }
    }
    wrong
}

async fn check(name: &str) {
    let wrong = play(name).await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_duplicate_stores_keep_the_surviving_copy() {
    check("vllm_duplicate_stores").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_unset_hash_seed_still_hits() {
    check("vllm_unset_seed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_lora_with_a_path_hits_its_adapter_context() {
    check("vllm_lora_path").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_cache_salt_isolates_salted_blocks() {
    check("vllm_cache_salt").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_cpu_offload_counts_shared_chunk_announcements() {
    check("vllm_cpu_offload").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_lora_namespace_hits_its_adapter_context() {
    check("sglang_lora_namespace").await;
}
