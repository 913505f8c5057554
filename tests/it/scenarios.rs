//! The recorded engine scenarios (`tests/fixtures/events/scenarios/`, produced by vLLM 0.33's
//! and SGLang 0.5.23's own caches): each fixture is served by `mooncake_conductor play` into the
//! running binary, and every query must get the answer the engine's own cache state gives
//! (`<name>.expect.json`); `mooncake_conductor check --expect` must give the same answers offline.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mooncake_conductor::fixture::format::Fixture;
use mooncake_conductor::gateway::pb;
use serde_json::{Value, json};

use crate::support::server::Server;
use crate::support::tool::{self, Tool};
use crate::support::{WAIT, eventually, free_port, http};

const SCENARIOS: [&str; 6] = [
    "sglang_lora_namespace",
    "vllm_cache_salt",
    "vllm_cpu_offload",
    "vllm_duplicate_stores",
    "vllm_lora_path",
    "vllm_unset_seed",
];
const TOOL_WAIT: Duration = Duration::from_secs(30);

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/events/scenarios")
}

/// One scenario: its fixture, its queries and the engine's answers (`instances` objects).
struct Scenario {
    name: String,
    file: PathBuf,
    queries_file: PathBuf,
    expect_file: PathBuf,
    fixture: Fixture,
    queries: Vec<Value>,
    expected: Vec<Value>,
}

fn json_file(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn load(name: &str) -> Scenario {
    let file = dir().join(format!("{name}.jsonl"));
    let fixture = Fixture::read_file(&file).unwrap_or_else(|e| panic!("{e}"));
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        fixture.to_text(),
        text,
        "{name}: the file is what the fixture writer writes"
    );
    let queries_file = dir().join(format!("{name}.queries.json"));
    let expect_file = dir().join(format!("{name}.expect.json"));
    let queries = json_file(&queries_file);
    let expected: Vec<Value> = json_file(&expect_file)
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            assert_eq!(
                e["query"],
                json!(i),
                "{name}: expected answers in query order"
            );
            e["instances"].clone()
        })
        .collect();
    assert!(!fixture.frames.is_empty(), "{name}: at least one batch");
    assert!(!queries.is_empty(), "{name}: nothing to check");
    assert_eq!(queries.len(), expected.len(), "{name}: an answer per query");
    Scenario {
        name: name.to_owned(),
        file,
        queries_file,
        expect_file,
        fixture,
        queries,
        expected,
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

fn counts(device: i64, cpu_local: i64, cpu_share: i64, disk: i64) -> Value {
    json!({"device": device, "cpu_local": cpu_local, "cpu_share": cpu_share, "disk": disk})
}

/// A gRPC answer in `check`'s shape: instance → its four counts and each rank's.
fn answer(reply: &pb::QueryResponse) -> Value {
    let mut out = serde_json::Map::new();
    for (instance, row) in &reply.hits {
        let mut v = counts(row.device, row.cpu_local, row.cpu_share, row.disk);
        v["rank_matches"] = row
            .rank_matches
            .iter()
            .map(|(r, t)| {
                (
                    r.clone(),
                    counts(t.device, t.cpu_local, t.cpu_share, t.disk),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into();
        out.insert(instance.clone(), v);
    }
    Value::Object(out)
}

/// Serve the fixture with `play` into a running Conductor registered as the header says, then ask
/// every query over gRPC. Returns the mismatches, so one report lists them all.
async fn play(s: &Scenario) -> Vec<String> {
    let (name, h) = (&s.name, &s.fixture.header);
    let instance = h.instance_id.clone().expect("instance_id");
    let server = Server::start().await;
    let (bind, replay_bind) = (
        format!("tcp://127.0.0.1:{}", free_port()),
        format!("tcp://127.0.0.1:{}", free_port()),
    );
    // A PUB drops what it sends before the subscription arrives: the replay socket fills what the
    // subscription missed, and the last batch repeated while `play` lingers tells it where the
    // stream ends.
    let player = Tool::spawn(&[
        "play",
        s.file.to_str().unwrap(),
        "--bind",
        &bind,
        "--replay-bind",
        &replay_bind,
        "--as-fast",
        "--wait-subscriber",
        "20",
        "--linger",
        "2",
        "--repeat-last",
        "0.05",
    ]);
    let registration = json!({
        "instance_id": instance, "endpoint": bind, "replay_endpoint": replay_bind,
        "publisher_type": h.publisher_type, "model_name": h.model_name,
        "lora_name": h.lora_name.clone().unwrap_or_default(), "block_size": h.block_size,
        "dp_rank": h.dp_rank, "hash_profile": h.hash_profile,
    });
    let reply = server.register(&registration).await;
    assert_eq!(reply.ret, 0, "{name}: {:?}", reply.error);

    let service = format!("{instance}|default|{}", h.dp_rank.expect("dp_rank"));
    let last = h.last_seq.expect("last_seq");
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
    barrier["endpoint"] = json!(format!("tcp://127.0.0.1:{}", free_port()));
    barrier["replay_endpoint"] = json!("");
    let reply = server.register(&barrier).await;
    assert_eq!(reply.ret, 0, "{name}: {:?}", reply.error);

    let mut wrong = Vec::new();
    for (i, (q, want)) in s.queries.iter().zip(&s.expected).enumerate() {
        let request = pb::QueryRequest {
            model_name: h.model_name.clone().expect("model_name"),
            lora_name: text(&q["lora_name"]),
            block_size: h.block_size.expect("block_size").into(),
            token_ids: q["token_ids"]
                .as_array()
                .expect("token_ids")
                .iter()
                .map(|t| t.as_i64().expect("token") as i32)
                .collect(),
            cache_salt: text(&q["cache_salt"]),
            instance_filter: text(&q["instance"]),
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
        let Some(row) = reply.hits.get(&instance) else {
            wrong.push(format!(
                "{name} query {i}: no row for {instance}, want {want}"
            ));
            continue;
        };
        let got = answer(&reply);
        if &got != want || row.longest_matched != row.disk {
            wrong.push(format!(
                "{name} query {i} ({}): got {got} (longest_matched {}), engine says {want}",
                text(&q["why"]),
                row.longest_matched
            ));
        }
    }
    let played = player.finish(TOOL_WAIT).await;
    assert!(played.status.success(), "{name}: {}", tool::stderr(&played));
    wrong
}

/// `check --expect` on the same files: exit 0, and the printed answers are the engine's.
async fn check_offline(s: &Scenario) -> Vec<String> {
    let args = [
        "check",
        s.file.to_str().unwrap(),
        "--queries",
        s.queries_file.to_str().unwrap(),
        "--expect",
        s.expect_file.to_str().unwrap(),
    ];
    let out = tool::run(&args, TOOL_WAIT).await;
    let (stdout, stderr) = (tool::stdout(&out), tool::stderr(&out));
    let mut wrong = Vec::new();
    if !out.status.success() {
        wrong.push(format!("{}: check failed: {stderr}\n{stdout}", s.name));
    }
    let printed: Vec<Value> = stdout
        .lines()
        .filter(|l| !l.starts_with("diff: "))
        .map(|l| serde_json::from_str::<Value>(l).expect("an answer line")["instances"].clone())
        .collect();
    if printed != s.expected {
        wrong.push(format!(
            "{}: check printed {printed:?}, engine says {:?}",
            s.name, s.expected
        ));
    }
    wrong
}

async fn scenario(name: &str) {
    let s = load(name);
    let mut wrong = play(&s).await;
    wrong.extend(check_offline(&s).await);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_scenario_file_is_tested() {
    let mut files: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".json") || f.ends_with(".jsonl"))
        .collect();
    files.sort();
    let mut want: Vec<String> = SCENARIOS
        .iter()
        .flat_map(|n| [".expect.json", ".jsonl", ".queries.json"].map(|s| format!("{n}{s}")))
        .collect();
    want.sort();
    assert_eq!(files, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_duplicate_stores_keep_the_surviving_copy() {
    scenario("vllm_duplicate_stores").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_unset_hash_seed_still_hits() {
    scenario("vllm_unset_seed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_lora_with_a_path_hits_its_adapter_context() {
    scenario("vllm_lora_path").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_cache_salt_isolates_salted_blocks() {
    scenario("vllm_cache_salt").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_cpu_offload_counts_shared_chunk_announcements() {
    scenario("vllm_cpu_offload").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_lora_namespace_hits_its_adapter_context() {
    scenario("sglang_lora_namespace").await;
}
