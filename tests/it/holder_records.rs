//! A holder record whose id lies far past what the data directory holds (crafted, or a bad
//! peer's) is corrupt data, refused as it is read: the service never makes a slot for every id
//! below it, so `on_corrupt_data` decides, and a start costs no more than a normal one.

use mooncake_conductor::storage::rocks::RocksStore;
use mooncake_conductor::storage::{Cf, KvOp, KvStore};
use serde_json::json;

use crate::support::deliver::handshake;
use crate::support::engine::{self, Registration};
use crate::support::grpc::register_request;
use crate::support::player::Player;
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http};

const MIB: u64 = 1 << 20;

/// The service's peak resident set (`VmHWM`), in bytes.
fn peak(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// Move the data directory's only holder record to `id`.
fn move_holder(dir: &std::path::Path, id: u32) {
    let store = RocksStore::open(&dir.join("data")).unwrap();
    let mut records = Vec::new();
    store
        .scan_prefix(Cf::Holders, b"", &mut |k, v| {
            records.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
    assert_eq!(records.len(), 1, "one holder was checkpointed");
    let (key, value) = records.pop().unwrap();
    let mut moved = key[..8].to_vec();
    moved.extend_from_slice(&id.to_be_bytes());
    store
        .write(vec![
            KvOp::Delete {
                cf: Cf::Holders,
                key,
            },
            KvOp::Put {
                cf: Cf::Holders,
                key: moved,
                value,
            },
        ])
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_record_of_id_2_27_is_refused_as_corrupt_and_the_service_starts_small() {
    // A store's holder, checkpointed on a clean stop.
    let server = Server::start().await;
    let mut store = Player::start(false, 1).await;
    let r = Registration::mooncake("store", &store.endpoint)
        .block_size(16)
        .json();
    let reply = server.grpc().await.register(register_request(&r)).await;
    assert_eq!(reply.unwrap().into_inner().ret, 0);
    let batch = engine::mooncake_batch(vec![engine::mooncake_event(
        "stored", "m", 16, "node-0", "obj", "cpu", 7,
    )]);
    handshake(&server, &mut store, "store|default|0", batch).await;
    let mut server = server;
    assert_eq!(server.terminate(), Some(0));
    let dir = server.into_dir();

    // A normal start of that directory, for the memory it takes.
    let config = json!({"on_corrupt_data": "move_aside"});
    let mut normal = Server::start_in(dir, config.clone()).await;
    let view = http::get(normal.http_port, "/global_view").await.json();
    assert_eq!(view["contexts"][0]["prefix_count"], json!(1), "{view}");
    let normal_peak = peak(&normal);
    assert_eq!(normal.terminate(), Some(0));
    let dir = normal.into_dir();
    move_holder(dir.path(), 1 << 27);

    // By default, corrupt data stops start-up with a clear error (no abort).
    let mut refused = Server::spawn_in(dir, json!({}));
    assert!(!refused.ready_or_exited().await, "{}", refused.log());
    let log = refused.log();
    let code = refused.terminate();
    assert!(
        code.is_some_and(|c| c != 0),
        "an error exit, not a signal: {code:?} {log}"
    );
    assert!(
        log.contains("holder record 134217728") && log.contains("unused holder ids"),
        "{log}"
    );
    let dir = refused.into_dir();

    // With move_aside, it starts empty within 64 MiB of the normal start's peak.
    let mut crafted = Server::spawn_in(dir, config);
    assert!(crafted.ready_or_exited().await, "{}", crafted.log());
    eventually("/health answers", WAIT, || async {
        (http::get(crafted.http_port, "/health").await.status == 200).then_some(())
    })
    .await;
    let crafted_peak = peak(&crafted);
    assert!(
        crafted_peak < normal_peak + 64 * MIB,
        "peak {crafted_peak} against {normal_peak} for a normal start"
    );
    let view = http::get(crafted.http_port, "/global_view").await.json();
    assert_eq!(view["contexts"], json!([]), "{view}");
    assert!(
        crafted.log().contains("unused holder ids"),
        "{}",
        crafted.log()
    );
}
