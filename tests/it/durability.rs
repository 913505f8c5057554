//! Durability against the real binary (SIGKILL convergence is in `convergence`): a publisher that
//! restarted while the Conductor was down loses its old blocks,
//! a schema-version-1 database opens, a newer or unreadable one is refused (or moved aside).

use std::process::{Command, Stdio};

use mooncake_conductor::gateway::pb;
use serde_json::json;

use crate::support::deliver::deliver;
use crate::support::deliver::handshake;
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::fleet::adapter_store;
use crate::support::fleet::{BS, MODEL, register};
use crate::support::fleet::{prompt, remove, store};
use crate::support::player::Player;
use crate::support::query::{adapter_hits, answers};
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http};

/// A new data directory is created at the current schema: no migration runs, so none is logged;
/// and a log written to a file carries no colour codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_data_directory_starts_at_the_current_schema_with_a_plain_log() {
    let server = Server::start_with(json!({})).await;
    let log = server.log();
    assert!(log.contains("mooncake_conductor listening"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a log file:\n{log}"
    );
    for line in ["applied schema migration", "dropped", "rebuild from replay"] {
        assert!(!log.contains(line), "a new store logged {line:?}:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_restarted_while_the_conductor_was_down_loses_its_old_blocks() {
    let mut server = Server::start().await;
    let mut player = Player::start(true, 0).await;
    register(&server, "e", &player).await;
    handshake(&server, &mut player, "e|default|0", store(1, "GPU")).await;
    player.publish(store(2, "GPU")).await;
    player.publish(store(3, "GPU")).await;
    eventually("hits", WAIT, || async {
        let a = answers(&server).await;
        (a[1].0 == 8 && a[2].0 == 8 && a[3].0 == 8).then_some(())
    })
    .await;
    assert_eq!(server.terminate(), Some(0));
    let dir = server.into_dir();
    player.restart(0);
    player.publish_lost(store(4, "GPU"));
    let server = Server::start_in(dir, json!({})).await;
    eventually("old blocks gone after recovery", WAIT, || async {
        let a = answers(&server).await;
        (a[1].0 == 0 && a[2].0 == 0 && a[3].0 == 0).then_some(())
    })
    .await;
    // The new process's stream is then followed from its start.
    player.publish(store(5, "GPU")).await;
    deliver(&server, &mut player, "e|default|0").await;
    eventually("new stream indexed", WAIT, || async {
        let a = answers(&server).await;
        (a[4].0 == 8 && a[5].0 == 8).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_registrations_and_the_index() {
    let mut server = Server::start().await;
    let mut player = Player::start(true, 0).await;
    register(&server, "e", &player).await;
    handshake(&server, &mut player, "e|default|0", store(1, "GPU")).await;
    player.publish(store(2, "DISK")).await;
    eventually("hits", WAIT, || async {
        (answers(&server).await[2].2 == 8).then_some(())
    })
    .await;
    let before = answers(&server).await;
    assert_eq!(server.terminate(), Some(0));
    let server = Server::start_in(server.into_dir(), json!({})).await;
    assert_eq!(answers(&server).await, before, "ready means recovered");
    let services = http::get(server.http_port, "/services").await.json();
    assert_eq!(services["count"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_and_translated_keys_survive_a_restart() {
    // Registered with another seed than the engine's: the index derives keys from the tokens and
    // keeps the engine's hashes as aliases, which must come back after a restart.
    let mut server = Server::start().await;
    let mut player = Player::start(true, 0).await;
    let mut profile = vllm_cbor_profile();
    profile["python_hash_seed"] = json!("7");
    let reg = Registration::vllm("e", &player.endpoint)
        .replay(player.replay_endpoint.as_deref())
        .model(MODEL)
        .block_size(BS)
        .profile(profile)
        .json();
    server.register_ok(&reg).await;
    // Batches apply in order: once a later store of prompt `p` answers, everything before it
    // has been applied (the status's last seq is only what was received).
    async fn applied_through(server: &Server, player: &mut Player, p: i32) {
        player.publish(store(p, "GPU")).await;
        deliver(server, player, "e|default|0").await;
        eventually("the marker prompt is indexed", WAIT, || async {
            (answers(server).await[p as usize].0 == 8).then_some(())
        })
        .await;
    }
    // Two identical prompts scheduled together: the engine announces the blocks twice.
    handshake(&server, &mut player, "e|default|0", store(1, "GPU")).await;
    player.publish(store(1, "GPU")).await;
    applied_through(&server, &mut player, 2).await;
    assert_eq!(answers(&server).await[1].0, 8);
    assert_eq!(server.terminate(), Some(0));
    let mut server = Server::start_in(server.into_dir(), json!({})).await;
    assert_eq!(answers(&server).await[1].0, 8, "ready means recovered");
    // One copy of block 1 evicted: the other stays, as before the restart.
    player.publish(remove(1, 1, "GPU")).await;
    applied_through(&server, &mut player, 3).await;
    assert_eq!(
        answers(&server).await[1].0,
        8,
        "one of two announcements removed"
    );
    player.publish(remove(1, 1, "GPU")).await;
    applied_through(&server, &mut player, 4).await;
    assert_eq!(answers(&server).await[1].0, 4, "both removed");
    // A child of a recovered block links through the recovered alias.
    let keys = engine::block_keys(&vllm_cbor_profile(), &prompt(1), BS, "");
    let child = engine::batch(
        vec![engine::vllm_stored(
            &keys[1..2],
            Some(keys[0]),
            &prompt(1)[4..8],
            BS,
            "GPU",
            None,
        )],
        0,
    );
    player.publish(child).await;
    applied_through(&server, &mut player, 5).await;
    assert_eq!(answers(&server).await[1].0, 8);
    let _ = server.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removals_reach_a_recovered_adapter_context() {
    // A base registration indexes the adapter blocks its engine reports in the adapter's own
    // context; removals name no adapter, so they go to every context the source fed, including
    // the ones recovered from disk.
    let mut server = Server::start().await;
    let mut player = Player::start(true, 0).await;
    register(&server, "e", &player).await;
    handshake(&server, &mut player, "e|default|0", adapter_store(1, "ad")).await;
    eventually("adapter blocks indexed", WAIT, || async {
        (adapter_hits(&server, "ad", 1).await == 8).then_some(())
    })
    .await;
    assert_eq!(server.terminate(), Some(0));
    let mut server = Server::start_in(server.into_dir(), json!({})).await;
    assert_eq!(
        adapter_hits(&server, "ad", 1).await,
        8,
        "ready means recovered"
    );
    let keys = engine::block_keys(&vllm_cbor_profile(), &prompt(1), BS, "ad");
    let evict = engine::batch(vec![engine::vllm_removed(&keys[1..], "GPU")], 0);
    player.publish(evict).await;
    deliver(&server, &mut player, "e|default|0").await;
    // A later store into the adapter context: once it answers, that context's mailbox is past
    // the removal.
    player.publish(adapter_store(2, "ad")).await;
    deliver(&server, &mut player, "e|default|0").await;
    eventually("the later adapter store is indexed", WAIT, || async {
        (adapter_hits(&server, "ad", 2).await == 8).then_some(())
    })
    .await;
    assert_eq!(
        adapter_hits(&server, "ad", 1).await,
        4,
        "the engine evicted block 1 of the adapter prompt"
    );
    let _ = server.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_unregistered_and_registered_again_does_not_bring_back_its_old_blocks() {
    // Checkpoints only at shutdown: the unregistration and the new registration fall between
    // two checkpoints, so the context's key is live again when the next one runs.
    let slow = json!({"checkpoint_interval_ms": 3_600_000});
    let mut server = Server::start_with(slow.clone()).await;
    let mut player = Player::start(true, 0).await;
    register(&server, "e", &player).await;
    handshake(&server, &mut player, "e|default|0", store(1, "GPU")).await;
    eventually("indexed", WAIT, || async {
        (answers(&server).await[1].0 == 8).then_some(())
    })
    .await;
    assert_eq!(server.terminate(), Some(0));
    let mut server = Server::start_in(server.into_dir(), slow.clone()).await;
    assert_eq!(answers(&server).await[1].0, 8, "recovered");
    // The engine moves: unregister (the context goes with its last source) and register the
    // new endpoint, whose engine holds nothing yet.
    server.unregister_ok("e").await;
    let moved = Player::start(true, 0).await;
    register(&server, "e", &moved).await;
    assert_eq!(
        answers(&server).await[1].0,
        0,
        "the new registration holds nothing"
    );
    assert_eq!(server.terminate(), Some(0));
    let server = Server::start_in(server.into_dir(), slow).await;
    assert_eq!(
        answers(&server).await[1].0,
        0,
        "the old incarnation's blocks stay gone after a restart"
    );
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

fn fixture_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/db-v1/data");
    copy_dir(&fixture, &dir.path().join("data"));
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_version_1_database_opens_with_the_current_binary() {
    let server = Server::start_in(fixture_copy(), json!({})).await;
    let services = http::get(server.http_port, "/services").await.json();
    assert_eq!(services["services"][0]["InstanceID"], "fixture-0");
    let mut client = server.grpc().await;
    let q = pb::QueryRequest {
        model_name: "fixture-model".into(),
        block_size: 4,
        token_ids: (1..=8).collect(),
        ..Default::default()
    };
    let r = client.query(q).await.unwrap().into_inner();
    assert_eq!(r.hits["fixture-0"].device, 8);
}

/// A schema 4 database (the records of one, the version set back) migrates: the blocks under
/// derived keys go, and the source, whose position the migration set past every batch, is
/// dropped and rebuilt from its publisher's replay buffer once it publishes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_4_database_rebuilds_its_derived_blocks_from_the_publishers_replay() {
    use mooncake_conductor::storage::KvStore;
    use mooncake_conductor::storage::migrations::version_op;
    let mut server = Server::start().await;
    let mut player = Player::start(true, 0).await;
    register(&server, "e", &player).await;
    handshake(&server, &mut player, "e|default|0", store(1, "GPU")).await;
    player.publish(store(2, "GPU")).await;
    deliver(&server, &mut player, "e|default|0").await;
    eventually("hits", WAIT, || async {
        let a = answers(&server).await;
        (a[1].0 == 8 && a[2].0 == 8).then_some(())
    })
    .await;
    assert_eq!(server.terminate(), Some(0));
    let dir = server.into_dir();
    {
        let store =
            mooncake_conductor::storage::rocks::RocksStore::open(&dir.path().join("data")).unwrap();
        // A schema 4 store has no source records (schema 7 added them).
        let no_sources = mooncake_conductor::storage::KvOp::DeleteRange {
            cf: mooncake_conductor::storage::Cf::Sources,
            from: Vec::new(),
            to: vec![0xff; 64],
        };
        store.write(vec![no_sources, version_op(4)]).unwrap();
    }
    let server = Server::start_in(dir, json!({})).await;
    assert!(
        server.log().contains("applied schema migration 0005"),
        "{}",
        server.log()
    );
    let a = answers(&server).await;
    assert_eq!(
        (a[1].0, a[2].0),
        (0, 0),
        "blocks under derived keys went with the migration: {}",
        server.service_status("e|default|0").await
    );
    player.publish(store(3, "GPU")).await;
    deliver(&server, &mut player, "e|default|0").await;
    eventually("rebuilt from the replay buffer", WAIT, || async {
        let a = answers(&server).await;
        (a[1].0 == 8 && a[2].0 == 8 && a[3].0 == 8).then_some(())
    })
    .await;
}

/// Start the binary on `dir` and expect it to refuse; returns its log.
fn expect_refusal(dir: &std::path::Path, extra: serde_json::Value) -> (Option<i32>, String) {
    let mut config = json!({"http_server_port": 0, "rpc_server_port": 0,
        "bind_address": "127.0.0.1", "data_dir": dir.join("data")});
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    let path = dir.join("conductor.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mooncake_conductor"))
        .env("CONDUCTOR_CONFIG_PATH", &path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_or_unreadable_database_is_refused_with_a_clear_message() {
    use mooncake_conductor::storage::KvStore;
    use mooncake_conductor::storage::migrations::{CURRENT_VERSION, version_op};
    let dir = fixture_copy();
    {
        let store =
            mooncake_conductor::storage::rocks::RocksStore::open(&dir.path().join("data")).unwrap();
        store.write(vec![version_op(CURRENT_VERSION + 1)]).unwrap();
    }
    let (code, log) = expect_refusal(dir.path(), json!({}));
    assert_ne!(code, Some(0));
    assert!(log.contains("newer than this binary"), "{log}");

    let dir = fixture_copy();
    std::fs::write(dir.path().join("data/CURRENT"), b"garbage\n").unwrap();
    let (code, log) = expect_refusal(dir.path(), json!({}));
    assert_ne!(
        code,
        Some(0),
        "an unreadable database stops start-up by default"
    );
    assert!(log.contains("data"), "{log}");
    // With move_aside, it starts empty and keeps the old directory.
    let server = Server::start_in(dir, json!({"on_corrupt_data": "move_aside"})).await;
    let services = http::get(server.http_port, "/services").await.json();
    assert_eq!(services["count"], 0);
    let moved = std::fs::read_dir(server.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("data.unreadable-")
        });
    assert!(moved, "the unreadable directory is kept aside");
}

/// Run an operational command of the binary on `dir`'s data directory.
fn admin(dir: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let config = json!({"data_dir": dir.join("data")});
    let path = dir.join("admin.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mooncake_conductor"))
        .args(args)
        .env("CONDUCTOR_CONFIG_PATH", &path)
        .stderr(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn verify_dump_and_compact_read_a_stopped_data_directory() {
    let dir = fixture_copy();
    let (code, out) = admin(dir.path(), &["verify"]);
    assert_eq!(code, Some(0), "{out}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (
            report["schema_version"].as_u64(),
            report["registrations"].as_u64(),
            report["contexts"].as_u64(),
            report["pairs"].as_u64()
        ),
        (Some(1), Some(1), Some(1), Some(2))
    );
    let (code, out) = admin(dir.path(), &["dump", "fixture-model"]);
    assert_eq!(code, Some(0));
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["model_name"], "fixture-model");
    assert_eq!(
        lines[0]["hash_profile"]["root_digest"],
        "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
    );
    assert_eq!(lines[1]["tier"], "device");
    assert_eq!(lines[1]["blocks"].as_array().map(Vec::len), Some(2));
    let (code, out) = admin(dir.path(), &["dump", "no-such-model"]);
    assert_eq!((code, out.as_str()), (Some(0), ""));
    assert_eq!(admin(dir.path(), &["compact"]).0, Some(0));
    assert_eq!(
        admin(dir.path(), &["verify"]).0,
        Some(0),
        "still readable after compaction"
    );
    assert_ne!(admin(dir.path(), &["bogus"]).0, Some(0));
}
