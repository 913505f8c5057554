//! The fixture tools as an operator runs them: `record` a live publisher that loses messages,
//! `play` the file back with lost messages and a publisher restart into a running Conductor, and
//! `check` the same file offline. Every path gives the answers the original stream gave.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::deliver::handshake;
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::player::Player;
use crate::support::server::Server;
use crate::support::tool::{self, Tool};
use crate::support::{WAIT, eventually, free_port, http};

const BLOCK: u32 = 4;
const TOOL_WAIT: Duration = Duration::from_secs(30);

fn prompt(first: i32) -> Vec<i32> {
    (first..first + 12).collect()
}

/// Eight batches. Batch 4 clears the engine's cache before it stores again, so a publisher
/// restart before it (whose blocks the Conductor drops) leaves what the original stream leaves.
fn workload() -> Vec<Vec<u8>> {
    let p = vllm_cbor_profile();
    let store = |first: i32| engine::vllm_store_prompt(&p, &prompt(first), BLOCK, "GPU", 0);
    let keys = |first: i32| engine::block_keys(&p, &prompt(first), BLOCK, "");
    let remove_last = |first: i32| {
        let k = keys(first);
        engine::batch(vec![engine::vllm_removed(&k[2..], "GPU")], 0)
    };
    let clear_and_store = {
        let tokens = prompt(400);
        let k = keys(400);
        engine::batch(
            vec![
                engine::vllm_cleared(),
                engine::vllm_stored(&k, None, &tokens, BLOCK, "GPU", None),
            ],
            0,
        )
    };
    vec![
        store(100),
        store(200),
        store(300),
        remove_last(200),
        clear_and_store,
        store(500),
        store(600),
        remove_last(500),
    ]
}

fn queries() -> Vec<Value> {
    [100, 200, 300, 400, 500, 600]
        .iter()
        .map(|&f| json!({"token_ids": prompt(f)}))
        .collect()
}

/// `/query` rows reduced to what `check` prints: the four counts and each rank's.
fn row(v: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for (instance, r) in v["instances"].as_object().cloned().unwrap_or_default() {
        let pick = |x: &Value| {
            json!({"device": x["device"], "cpu_local": x["cpu_local"],
                   "cpu_share": x["cpu_share"], "disk": x["disk"]})
        };
        let mut counts = pick(&r);
        let ranks: serde_json::Map<String, Value> = r["rank_matches"]
            .as_object()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, t)| (k, pick(&t)))
            .collect();
        counts["rank_matches"] = Value::Object(ranks);
        out.insert(instance, counts);
    }
    Value::Object(out)
}

async fn answers(server: &Server, model: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for q in queries() {
        let body = json!({"model": model, "block_size": BLOCK, "token_ids": q["token_ids"]});
        let r = http::post_json(server.http_port, "/query", &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        out.push(row(&r.json()));
    }
    out
}

async fn status(server: &Server, service: &str) -> Option<Value> {
    let status = http::get(server.http_port, "/services/status").await.json();
    status["services"]
        .as_array()?
        .iter()
        .find(|s| s["service"] == service)
        .cloned()
}

async fn register(server: &Server, instance: &str, endpoint: &str, replay: &str, model: &str) {
    let reg = Registration::vllm(instance, endpoint)
        .replay(Some(replay))
        .model(model)
        .block_size(BLOCK)
        .json();
    server.register_ok(&reg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_play_with_faults_and_check_give_the_original_answers() {
    let batches = workload();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("recorded.jsonl");
    let file_arg = file.to_str().unwrap();

    // The original: a live publisher the Conductor follows, losing batches 1 and 5 on the live
    // stream (the Conductor and the recorder both fill them through replay).
    let server = Server::start().await;
    let mut live = Player::start(true, 0).await;
    let replay = live.replay_endpoint.clone().unwrap();
    register(&server, "engine", &live.endpoint, &replay, "original").await;
    handshake(&server, &mut live, "engine|default|0", batches[0].clone()).await;
    live.publish_lost(batches[1].clone());
    live.publish(batches[2].clone()).await;
    // The Conductor fills batch 1 through replay first: the next replay answered is the recorder's.
    eventually("the Conductor filled batch 1", WAIT, || async {
        let st = status(&server, "engine|default|0").await?;
        (st["last_seq"] == json!(2)).then_some(())
    })
    .await;
    let replays = live.replays_answered();

    let recorder = Tool::spawn(&[
        "record",
        "--endpoint",
        &live.endpoint,
        "--replay-endpoint",
        &replay,
        "--batches",
        "8",
        "--publisher",
        "vLLM",
        "--block-size",
        "4",
        "--out",
        file_arg,
    ]);
    // The recorder first replays 0..=2; what it then misses live it replays too. Connected: the
    // Conductor, the recorder's probe and its subscriber; and the recorder's replay answered.
    eventually(
        "the recorder subscribed and replayed the buffer",
        WAIT,
        || async { (live.accepted() >= 3 && live.replays_answered() > replays).then_some(()) },
    )
    .await;
    for (seq, payload) in batches.iter().enumerate().skip(3) {
        if seq == 5 {
            live.publish_lost(payload.clone());
        } else {
            live.publish(payload.clone()).await;
        }
    }
    let recorded = recorder.finish(TOOL_WAIT).await;
    assert!(recorded.status.success(), "{}", tool::stderr(&recorded));
    let applied = eventually("the original stream applied", WAIT, || async {
        let st = status(&server, "engine|default|0").await?;
        (st["last_seq"] == json!(7)).then_some(st)
    })
    .await;
    assert!(applied["replays_ok"].as_u64() >= Some(1), "{applied}");
    let original = eventually("original answers settle", WAIT, || async {
        let a = answers(&server, "original").await;
        (a[5]["engine"]["device"] == json!(12)).then_some(a)
    })
    .await;
    assert_eq!(original[0]["engine"]["device"], json!(0), "cleared");
    assert_eq!(original[3]["engine"]["device"], json!(12));
    assert_eq!(
        original[4]["engine"]["device"],
        json!(8),
        "last block removed"
    );

    // The file holds every batch once, in order, though the recorder lost one live.
    let text = std::fs::read_to_string(&file).unwrap();
    let mut lines = text.lines();
    let header: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(header["format"], "mooncake-conductor-fixture");
    assert_eq!(header["version"], 1);
    assert_eq!(
        (header["frames"].clone(), header["gaps"].clone()),
        (json!(8), json!([]))
    );
    assert_eq!(
        (header["first_seq"].clone(), header["last_seq"].clone()),
        (json!(0), json!(7))
    );
    assert!(header["replayed"].as_u64() >= Some(4), "{header}");
    assert!(
        header["live_gaps"]
            .as_array()
            .unwrap()
            .contains(&json!([5, 5])),
        "{header}"
    );
    assert_eq!(header["publisher_type"], "vLLM");
    let seqs: Vec<u64> = lines
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, (0..8).collect::<Vec<u64>>());

    // Played back into a second Conductor with batches 1 and 6 lost and a restart before 4.
    let replayed_into = Server::start().await;
    let (bind, replay_bind) = (
        format!("tcp://127.0.0.1:{}", free_port()),
        format!("tcp://127.0.0.1:{}", free_port()),
    );
    let player = Tool::spawn(&[
        "play",
        file_arg,
        "--bind",
        &bind,
        "--replay-bind",
        &replay_bind,
        // Time for each replay to end before the next fault.
        "--interval",
        "0.4",
        "--drop-seqs",
        "1,6",
        "--restart-at",
        "4",
        "--wait-subscriber",
        "20",
        "--linger",
        "3",
        "--repeat-last",
        "0.2",
    ]);
    register(&replayed_into, "engine", &bind, &replay_bind, "original").await;
    let played = player.finish(TOOL_WAIT).await;
    let log = tool::stderr(&played);
    assert!(played.status.success(), "{log}");
    assert!(log.contains("6 live, 2 lost, 1 restarts"), "{log}");
    let st = eventually("the faulted stream applied", WAIT, || async {
        let st = status(&replayed_into, "engine|default|0").await?;
        // Batch 7 is seq 3 after the restart.
        (st["last_seq"] == json!(3)).then_some(st)
    })
    .await;
    assert_eq!(st["restarts"], json!(1), "{st}");
    assert!(st["replays_ok"].as_u64() >= Some(1), "{st}");
    let faulted = answers(&replayed_into, "original").await;
    assert_eq!(
        faulted, original,
        "the faults change nothing the original left"
    );

    // Offline: the same answers, and a diff with a non-zero exit when they are not expected.
    let queries_path = dir.path().join("queries.json");
    std::fs::write(&queries_path, serde_json::to_vec(&queries()).unwrap()).unwrap();
    let expect_path = dir.path().join("expect.json");
    std::fs::write(&expect_path, serde_json::to_vec(&original).unwrap()).unwrap();
    let profile =
        "strategy=vllm_v1,algorithm=sha256_cbor,python_hash_seed=0,index_projection=low64_be";
    let check = |expect: &std::path::Path| {
        let args = [
            "check",
            file_arg,
            "--profile",
            profile,
            "--block-size",
            "4",
            "--instance",
            "engine",
            "--queries",
            queries_path.to_str().unwrap(),
            "--expect",
            expect.to_str().unwrap(),
        ]
        .map(str::to_owned);
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            tool::run(&args, TOOL_WAIT).await
        }
    };
    let out = check(&expect_path).await;
    assert!(out.status.success(), "{}", tool::stderr(&out));
    let printed: Vec<Value> = tool::stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["instances"].clone())
        .collect();
    assert_eq!(printed, original);
    let mut wrong = original.clone();
    wrong[3]["engine"]["device"] = json!(4);
    std::fs::write(&expect_path, serde_json::to_vec(&wrong).unwrap()).unwrap();
    let out = check(&expect_path).await;
    assert!(!out.status.success());
    let diff = tool::stdout(&out);
    assert!(diff.contains("diff: query 3: expected"), "{diff}");
    assert_eq!(diff.matches("diff:").count(), 1, "{diff}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_truncated_and_future_files_and_refusing_endpoints_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let header = r#"{"format":"mooncake-conductor-fixture","version":1,"frames":2,"first_seq":0,"last_seq":1,"gaps":[],"restarts":0}"#;
    let frame = r#"{"seq":0,"t_ms":0,"topic":"","payload":"kw=="}"#;
    let cases = [
        (
            write("foreign.hex", "92cb41d954fc40000000\n"),
            "is not a mooncake-conductor-fixture file",
        ),
        (
            write("truncated.jsonl", &format!("{header}\n{frame}\n")),
            "is truncated: its header announces 2 frames, the file has 1",
        ),
        (
            write("cut.jsonl", &format!("{header}\n{frame}\n{}", &frame[..20])),
            "line 3: not a frame",
        ),
        (
            write(
                "future.jsonl",
                &header.replace("\"version\":1", "\"version\":9"),
            ),
            "fixture format version 9; this binary reads version 1 only",
        ),
    ];
    let bind = format!("tcp://127.0.0.1:{}", free_port());
    for (path, want) in &cases {
        for command in ["play", "check"] {
            let args = match command {
                "play" => vec!["play", path, "--bind", &bind, "--wait-subscriber", "0"],
                _ => vec!["check", path, "--block-size", "4", "--queries", path],
            };
            let out = tool::run(&args, TOOL_WAIT).await;
            assert!(!out.status.success(), "{command} {path}");
            let err = tool::stderr(&out);
            assert!(err.contains(want), "{command} {path}: {err}");
        }
    }
    // Nothing listens on the port: the recorder says so instead of waiting forever.
    let refused = format!("tcp://127.0.0.1:{}", free_port());
    let out_file = dir.path().join("never.jsonl");
    let out = tool::run(
        &[
            "record",
            "--endpoint",
            &refused,
            "--batches",
            "1",
            "--out",
            out_file.to_str().unwrap(),
        ],
        TOOL_WAIT,
    )
    .await;
    assert!(!out.status.success());
    let err = tool::stderr(&out);
    assert!(
        err.contains(&format!("cannot connect to {refused}")),
        "{err}"
    );
    assert!(!out_file.exists());
}
