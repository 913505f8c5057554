//! Storage faults are visible and never destroy good data: only real corruption moves a data
//! directory aside; a failing checkpoint degrades `/health` and is caught up once writes work.

use std::process::{Command, Stdio};

use serde_json::json;

use crate::support::api::reg;
use crate::support::deliver::handshake;
use crate::support::fleet::{BS, MODEL, register};
use crate::support::query::grpc_query;
use crate::support::server::Server;
use crate::support::tool::Tool;
use crate::support::{WAIT, eventually, free_port, http};

/// Start a second service on `dir`'s data directory (while `dir`'s own service runs); it must
/// stop with an error. Returns its log.
fn second_service_refuses(dir: &std::path::Path, extra: serde_json::Value) -> String {
    let mut config = json!({
        "http_server_port": 0, "rpc_server_port": 0,
        "bind_address": "127.0.0.1", "data_dir": dir.join("data"),
    });
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    let path = dir.join("second.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_mooncake_conductor"))
        .env("CONDUCTOR_CONFIG_PATH", &path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = Tool::from_child(child, "the second service").finish_blocking(WAIT);
    assert_ne!(out.status.code(), Some(0));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_never_moves_the_data_directory_aside() {
    let config = json!({"on_corrupt_data": "move_aside"});
    let server = Server::start_with(config.clone()).await;
    let r = http::post_json(server.http_port, "/register", &reg("held", free_port())).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let before = entries(server.dir.path());

    let log = second_service_refuses(server.dir.path(), config);
    assert!(log.contains("LOCK") || log.contains("lock"), "{log}");
    assert!(log.contains("not moved aside"), "{log}");
    assert!(!log.contains("starting empty"), "{log}");
    let after: Vec<String> = entries(server.dir.path())
        .into_iter()
        .filter(|n| n != "second.json")
        .collect();
    assert_eq!(after, before, "nothing was moved");

    // The first service still serves, and its registration is still on disk after a restart.
    let services = http::get(server.http_port, "/services").await.json();
    assert_eq!(services["count"], 1);
    let dir = server.into_dir();
    let server = Server::start_in(dir, json!({})).await;
    let services = eventually("registration restored", WAIT, || async {
        let s = http::get(server.http_port, "/services").await.json();
        (s["count"] == 1).then_some(s)
    })
    .await;
    assert_eq!(services["services"][0]["InstanceID"], "held");
}

async fn health(server: &Server) -> serde_json::Value {
    let r = http::get(server.http_port, "/health").await;
    assert_eq!(
        r.status,
        200,
        "a degraded service still serves: {}",
        r.text()
    );
    r.json()
}

fn metric(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(&format!("{name} ")))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_checkpoint_degrades_health_keeps_serving_and_catches_up() {
    use crate::support::engine::{self, vllm_cbor_profile};
    use crate::support::player::Player;

    let dir = tempfile::tempdir().unwrap();
    let switch = dir.path().join("disk-full");
    let env = [(
        mooncake_conductor::storage::fault_switch::FAULT_SWITCH_ENV,
        switch.as_path(),
    )];
    let config = json!({"checkpoint_interval_ms": 100});
    let mut server = Server::start_in_with_env(dir, config, &env).await;
    let mut player = Player::start(false, 0).await;
    register(&server, "e0", &player).await;
    assert_eq!(health(&server).await["status"], "ready");

    // The disk fills up: the next checkpoint fails.
    std::fs::write(&switch, b"").unwrap();
    let prompt: Vec<i32> = (0..8).collect();
    let store = engine::vllm_store_prompt(&vllm_cbor_profile(), &prompt, BS, "GPU", 0);
    handshake(&server, &mut player, "e0|default|0", store).await;
    let h = eventually("health degraded", WAIT, || async {
        let h = health(&server).await;
        (h["status"] == "degraded").then_some(h)
    })
    .await;
    assert!(
        h["reason"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{h}"
    );
    let text = http::get(server.http_port, "/metrics").await.text();
    assert_eq!(
        metric(&text, "conductor_storage_degraded"),
        Some(1),
        "{text}"
    );
    assert!(
        metric(&text, "conductor_checkpoint_failures_total") >= Some(1),
        "{text}"
    );
    // Queries are answered from memory meanwhile.
    let hits = grpc_query(&server, MODEL, prompt.clone(), BS as i64).await;
    assert_eq!(hits.hits["e0"].device, 8, "{hits:?}");

    // A registration that cannot be written is refused and leaves nothing behind.
    let r = http::post_json(server.http_port, "/register", &reg("e1", free_port())).await;
    assert_eq!(r.status, 500, "{}", r.text());
    let services = http::get(server.http_port, "/services").await.json();
    assert_eq!(services["count"], 1, "{services}");
    let view = http::get(server.http_port, "/global_view").await.json();
    assert_eq!(
        view["context_count"], 1,
        "no context of the refused registration: {view}"
    );

    // Space returns: the next round writes what was missed and health recovers.
    std::fs::remove_file(&switch).unwrap();
    eventually("health ready again", WAIT, || async {
        (health(&server).await["status"] == "ready").then_some(())
    })
    .await;
    let text = http::get(server.http_port, "/metrics").await.text();
    assert_eq!(
        metric(&text, "conductor_storage_degraded"),
        Some(0),
        "{text}"
    );
    // Killed (no final checkpoint): the disk holds the blocks stored while it was full.
    server.kill();
    let out = server.offline(&["dump", MODEL]);
    let dump = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dump.contains("e0"), "{dump}");
    assert!(dump.lines().count() >= 2, "{dump}");
}
